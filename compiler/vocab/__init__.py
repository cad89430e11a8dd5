"""The vocabulary: a tokenizer's tokens as the bytes they decode to.

- vocabulary.py: TokenVocabulary, the bytes of every token (GPT-2 byte alphabet,
  SentencePiece) and what outlines-core's Vocabulary receives.
- text_slice.py: the tokens that are plain JSON string text, set apart so walks skip them.
"""
