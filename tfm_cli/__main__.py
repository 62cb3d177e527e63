"""Entry point for `python -m tfm_cli` (also what torchrun launches)."""

from tfm_cli.cli import main

if __name__ == "__main__":
    main()
