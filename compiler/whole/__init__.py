"""The whole-table path: a regex's whole byte DFA (outlines-core), walked by every token.

Read in order: byte_dfa.py and token_walk.py (outlines-core's byte DFA read into arrays,
the vocabulary's trie walked through it from every state), minimize.py (the DFA made
minimal), tables.py and token_sets.py (the CompiledTable: successor groups, token sets,
distances), compile.py (the stages run in one call). The compile workers
(compiler/service/worker.py) run this path.
"""
