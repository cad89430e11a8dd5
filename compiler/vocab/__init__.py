"""The vocabulary: a tokenizer's tokens as the bytes they decode to, and as a trie.

- vocabulary.py: TokenVocabulary, the bytes of every token (GPT-2 byte alphabet,
  SentencePiece) and what outlines-core's Vocabulary receives.
- trie.py: the tokens as a byte trie in preorder, which every token walk reads.
"""
