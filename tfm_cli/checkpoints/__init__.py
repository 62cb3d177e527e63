"""The checkpoint: one safetensors file holding a model's weights, config, tokenizers and provenance.

- format.py: saving and loading a checkpoint (the fixed key list, atomic writes, one clear error per bad file).
- metadata.py: reading and validating its metadata before any tensor is read.
- averaging.py: `tfm average`, the mean of several checkpoints' weights.
"""
