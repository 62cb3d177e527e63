"""The one meaning of `--device` for every command: `auto` picks CUDA when present, else the CPU."""

from __future__ import annotations

import re

import torch

from tfm_cli.errors import TfmError


def resolve_device(name: str) -> torch.device:
    """The torch device for a --device value: `auto` = cuda when available, else cpu.

    Raises TfmError, naming the value, for a device string torch rejects or cannot use here.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not re.fullmatch(r"cuda(:[0-9]+)?", name):
        raise TfmError(f"--device {name}: tfm runs on cpu or cuda[:N]; use --device cpu or --device cuda")
    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        message = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise TfmError(f"--device {name}: not usable here ({message}); try --device cpu") from None
    return device
