"""Parallel text prepared for training: read, filtered, tokenized and kept in a cache folder, then batched.

- parallel_text.py: reading two text files as pairs of lines, in chunks; file fingerprints and hashes.
- filters.py: the corpus filters (one class each) and the settings that turn them on.
- cache.py: preparing a corpus into the cache folder, or finding it there (the pipeline).
- cache_folder.py: the cache folder's layout, and which files and folders tfm may remove.
- entry.py: the on-disk format of one prepared corpus (memory-mapped arrays and a manifest).
- file_locks.py: the locks that let runs, containers and hosts share a cache folder.
- cache_cleaning.py: what `tfm cache list|clean` lists and removes.
- tokenized.py: a tokenized corpus in memory (flat token tensors with offsets).
- subword_sampling.py, sentence_concatenation.py: per-epoch variants of a tokenized corpus.
- batching.py: epochs of token-budget batches, and padding.

Nothing here knows about models or optimizers; training/ uses it.
"""
