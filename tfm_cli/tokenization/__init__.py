"""Tokenizers: sentencepiece models with tfm's fixed special ids, and an imported model's piece table.

- tokenizer.py: training, loading and using a sentencepiece model (both sides of a pair).
- vocabulary.py: an imported model's vocabulary that numbers the pieces (Marian's vocab.json), language tags.
"""
