"""The declared dependency floors are true: the oldest torch pyproject.toml admits has what tfm uses."""

from __future__ import annotations

import re
import tomllib

from conftest import REPO_ROOT

# What tfm needs from torch, and the first release that has it.
TORCH_NEEDS = {
    "torch.optim.AdamW(fused=True) on CPU tensors (every `tfm train` step)": (2, 4),
    "torch.amp.GradScaler(device_type) (fp16 training)": (2, 3),
}


def declared_floor(package: str) -> tuple[int, ...]:
    """The version in `package>=X.Y` among pyproject.toml's dependencies, as a tuple of ints."""
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in dependencies:
        match = re.fullmatch(rf"{package}\s*>=\s*([\d.]+)", requirement.strip())
        if match:
            return tuple(int(part) for part in match.group(1).split("."))
    raise AssertionError(f"pyproject.toml declares no {package}>= floor")


def test_the_torch_floor_has_everything_tfm_uses():
    floor = declared_floor("torch")
    too_new = [need for need, since in TORCH_NEEDS.items() if floor < since]
    assert not too_new, f"torch>={'.'.join(map(str, floor))} lacks: {too_new}"


def test_training_really_uses_fused_adamw():
    # The reason for the floor: if training stops asking for the fused optimizer, the floor may fall.
    source = (REPO_ROOT / "tfm_cli" / "training" / "trainer.py").read_text()
    assert "torch.optim.AdamW(" in source and "fused=True" in source
