"""Checkpoint averaging (as fairseq's average_checkpoints.py): a float64 running sum, one input at a time.

Memory stays near two models' worth whatever the number of inputs: the sum, plus the one input
being read. Inputs must share the model config and the tokenizers; the output keeps both and
records in its provenance which files were averaged (name, step, sha256).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from tfm_cli.checkpoints.format import Checkpoint, read_checkpoint, write_checkpoint
from tfm_cli.errors import TfmError
from tfm_cli.textio.paths import check_input_file, check_output_path, file_sha256, resolved
from tfm_cli.training.run_dir import STEP_CHECKPOINT, step_checkpoints


def run_checkpoints(run_dir: Path, last: int) -> list[Path]:
    """The last `last` step checkpoints (checkpoint_NNNNNNNN.safetensors) of a `tfm train` run, oldest first."""
    if run_dir.exists() and not run_dir.is_dir():
        raise TfmError(f"{run_dir}: is a file; --run needs a `tfm train` run folder (or give checkpoint files)")
    if not run_dir.is_dir():
        raise TfmError(f"{run_dir}: no such run folder")
    if last < 1:
        raise TfmError(f"--last must be at least 1, got {last}")
    found = step_checkpoints(run_dir)
    if len(found) < last:
        raise TfmError(
            f"{run_dir}: asked for the last {last} step checkpoints, but only {len(found)} exist "
            "(checkpoint_NNNNNNNN.safetensors)"
        )
    return found[-last:]


def checkpoint_step(path: Path, checkpoint: Checkpoint) -> int | None:
    """The training step of a checkpoint: its provenance `step`, else the one in its file name, else None."""
    step = checkpoint.provenance.get("step")
    if isinstance(step, int):
        return step
    match = STEP_CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else None


def check_compatible(first_path: Path, first: Checkpoint, path: Path, other: Checkpoint) -> None:
    """Raise TfmError naming the first difference in model config or tokenizer between two checkpoints."""
    for field in dataclasses.fields(first.config):
        mine, theirs = getattr(first.config, field.name), getattr(other.config, field.name)
        if mine != theirs:
            raise TfmError(
                f"cannot average {path} with {first_path}: model.{field.name} is {theirs!r} in {path} "
                f"but {mine!r} in {first_path}"
            )
    for side, mine, theirs in (("source", first.src_tokenizer_bytes, other.src_tokenizer_bytes),
                               ("target", first.tgt_tokenizer_bytes, other.tgt_tokenizer_bytes),
                               ("source", first.src_vocab, other.src_vocab),
                               ("target", first.tgt_vocab, other.tgt_vocab)):
        if mine != theirs:
            raise TfmError(f"cannot average {path} with {first_path}: their {side} tokenizers differ")


def average_checkpoints(paths: list[Path], on_read: Callable[[Path], None] | None = None) -> Checkpoint:
    """The element-wise mean of the weights of `paths` (same config and tokenizers), as a Checkpoint.

    Sums in float64 and casts back to the first input's dtype per tensor. The result keeps the
    config and tokenizers; its provenance lists the inputs ({name, path, step, sha256}) under
    `averaged` and takes the largest input step as `step`. `on_read(path)` is called after each input.
    """
    if not paths:
        raise TfmError("no checkpoint to average; give files or --run DIR --last N")
    names = [str(path) for path in paths]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise TfmError(f"{repeated[0]}: given more than once; each checkpoint may be averaged only once")
    for path in paths:  # fail on a missing input before spending minutes reading the others
        check_input_file(path, "checkpoint")
    first_path = paths[0]
    first: Checkpoint | None = None
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    inputs = []
    for path in paths:
        checkpoint = read_checkpoint(path)
        if first is None:
            first = checkpoint
            dtypes = {name: tensor.dtype for name, tensor in checkpoint.weights.items()}
            sums = {name: tensor.to(torch.float64) for name, tensor in checkpoint.weights.items()}
        else:
            check_compatible(first_path, first, path, checkpoint)
            for name, tensor in checkpoint.weights.items():
                sums[name].add_(tensor.to(torch.float64))
        inputs.append({
            "name": path.name, "path": str(path), "step": checkpoint_step(path, checkpoint),
            "sha256": file_sha256(path),
        })
        checkpoint.weights = {}  # drop this input's tensors before the next one is read
        if on_read is not None:
            on_read(path)
    assert first is not None
    count = len(paths)
    weights = {name: (total / count).to(dtypes[name]) for name, total in sums.items()}
    steps = [item["step"] for item in inputs if item["step"] is not None]
    provenance = {
        "averaged": inputs,
        "step": max(steps) if steps else None,
        "averaged_from_provenance": first.provenance,
    }
    # The first input's tokenizers (bytes and piece tables) and decoding defaults go with the average; a
    # trained aligner does not: it reads one model's states, and the average is another model.
    alignment = {key: value for key, value in first.alignment.items() if not key.startswith("aligner")}
    return dataclasses.replace(first, weights=weights, provenance=provenance, alignment=alignment, aligner_weights={})


def average_to_file(paths: list[Path], output: Path, on_read: Callable[[Path], None] | None = None) -> Checkpoint:
    """Average `paths` and write the result to `output` atomically; returns the written Checkpoint."""
    if resolved(output) in {resolved(path) for path in paths}:
        raise TfmError(f"{output}: the output is also an input; choose another output path")
    check_output_path(output)
    averaged = average_checkpoints(paths, on_read)
    write_checkpoint(output, averaged)
    return averaged
