"""Inference: the decoding seam over the model (decoding), the searches (search), translating text in
batches (translation), attention alignments (alignment) and the views of inspect-attention (inspection)."""
