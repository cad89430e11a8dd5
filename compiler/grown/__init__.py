"""The grown path: our own regex -> NFA -> byte DFA grown where walks go -> LazyTable.

Read in order: regex_parse.py (the regex into a program), regex_nfa.py (a Thompson NFA and
its byte distances), lazy_dfa.py (the DFA determinized on demand), state_walk.py (one
state's trie walk), text_slice.py (JSON string text set apart from the walk), byte_bounds.py
and path_bound.py (distance bounds from bytes), and lazy_table.py (masks for the states
generation reaches, budget exact). pushdown.py: a grammar's recursive rules kept on a stack
(the same LazyTable over configurations; its budgets by a sound bound); substrings.py: whether
a grammar's language holds a text (the separator between a turn's tool calls).
"""
