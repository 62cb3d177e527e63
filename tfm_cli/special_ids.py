"""The four special token ids every tfm tokenizer, model config and checkpoint agrees on.

Fixed when a sentencepiece model is trained (sentencepiece has no pad id by default, so tfm sets
all four); a checkpoint records them in its model config.
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
