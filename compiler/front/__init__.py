"""Front ends: what a request asks for (constraint.py), written as one regex.

- constraint.py: the constraint kinds (JSON Schema, any JSON object, regex, Lark grammar,
  choices) and their parsing from request dicts.
- regex.py: a Constraint -> the regex the later stages compile; rust_regex.py checks users'
  own regexes; json_schema/ and grammar/ write schemas and Lark grammars.
- deadline.py: the wall on this Python work when it runs in the server's threads.
"""
