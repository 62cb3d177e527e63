"""tfm: a command-line neural machine translation toolkit built on the Transformer."""

__version__ = "0.1.0"
