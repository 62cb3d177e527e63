"""The exact-resume training state: counters, weights, Adam moments and RNG states.

Saved as safetensors tensors plus JSON metadata in train_state.safetensors: nothing is pickled.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from tfm_cli import distributed
from tfm_cli.checkpoints.format import model_weights
from tfm_cli.distributed import World
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer
from tfm_cli.training.moving_average import WeightMovingAverage

STATE_FORMAT = "tfm-train-state"
STATE_VERSION = 1


@dataclass
class Counters:
    """Everything of the loop's position that resume needs, besides tensors (saved as JSON)."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already consumed
    elapsed: float = 0.0  # training seconds, over all sessions
    best_value: float | None = None
    best_step: int = 0
    bad_validations: int = 0  # validations in a row without improvement
    world_size: int = 1  # ranks that trained the run; resume needs the same number (same effective batch)
    overflow_steps: int = 0  # fp16 updates skipped by the loss scaler (inf/nan gradients)
    nonfinite_steps: int = 0  # fp32/bf16 updates skipped for an inf/nan loss or gradient
    nonfinite_in_a_row: int = 0  # consecutive ones up to now; max_bad_steps of them stop the run


def state_tensors(
    model: Transformer, optimizer: torch.optim.Optimizer, rank_rng: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Model weights, Adam moments and RNG states as named CPU tensors (plus every rank's RNG, if given)."""
    tensors = {f"model.{name}": tensor for name, tensor in model_weights(model).items()}
    names = [name for name, _ in model.named_parameters()]
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer.{names[index]}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{index}"] = rng
    tensors.update(rank_rng or {})
    return tensors


def encode_state(
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    counters: Counters,
    rank_rng: dict[str, torch.Tensor] | None = None,
    moving_average: WeightMovingAverage | None = None,
) -> bytes:
    """The whole training state as safetensors bytes (tensors + JSON metadata), with the moving average of
    the weights when the run keeps one."""
    metadata = {
        "format": STATE_FORMAT,
        "format_version": str(STATE_VERSION),
        "counters": json.dumps(asdict(counters)),
        "scaler": json.dumps(scaler.state_dict() if scaler is not None else None),
    }
    tensors = state_tensors(model, optimizer, rank_rng)
    if moving_average is not None:
        tensors.update(moving_average.state_tensors())
    return save(tensors, metadata=metadata)


def read_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a training-state file; raises TfmError if it is not one."""
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as f:
            header_size = int.from_bytes(f.read(8), "little")
            metadata = json.loads(f.read(header_size)).get("__metadata__", {})
    except (SafetensorError, OSError, ValueError) as error:
        raise TfmError(f"{path}: unreadable training state ({error}); resume from a checkpoint instead") from None
    if not isinstance(metadata, dict) or metadata.get("format") != STATE_FORMAT or metadata.get("format_version") != str(STATE_VERSION):
        raise TfmError(f"{path}: not a tfm training state of version {STATE_VERSION}")
    return tensors, metadata


def gather_rank_rng(world: World, device: torch.device) -> dict[str, torch.Tensor]:
    """Every rank's RNG states, named rng.cpu.rankR (and rng.cuda.rankR on CUDA); empty for one process.

    A collective: every rank must call it. Ranks draw different dropout masks, so each has its own state.
    """
    if not world.distributed:
        return {}
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    named = {}
    for kind, state in states.items():
        for rank, gathered in enumerate(distributed.all_gather(state, world, device)):
            named[f"rng.{kind}.rank{rank}"] = gathered
    return named


def restore_state(
    path: Path,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    world: World = World(),
    moving_average: WeightMovingAverage | None = None,
) -> Counters:
    """Load weights, optimizer moments, RNG states and counters from `path` into the live objects
    (and the moving average of the weights, when the run keeps one).

    Raises TfmError if the run was trained by a different number of ranks than `world` has.
    """
    tensors, metadata = read_state(path)
    counters = decode_counters(metadata.get("counters"), path)
    if counters.world_size != world.world_size:
        raise TfmError(
            f"{path}: the run was trained with {counters.world_size} process(es) but this resume has "
            f"{world.world_size}; resume with `torchrun --nproc-per-node ...` giving {counters.world_size} processes "
            "in all (the effective batch and data order depend on it)"
        )
    with torch.no_grad():
        for name, param in model.named_parameters():
            saved = tensors.get(f"model.{name}")
            if saved is None or saved.shape != param.shape:
                raise TfmError(f"{path}: the training state does not match the model ({name}); start a new --run")
            if saved.dtype != param.dtype:
                raise damaged(path, f"model.{name} has dtype {saved.dtype}, the model's is {param.dtype}")
            if not bool(torch.isfinite(saved).all()):
                raise damaged(path, f"model.{name} holds NaN or infinite values")
            param.copy_(saved)
    if moving_average is not None:
        moving_average.restore(tensors, str(path))
    template = optimizer.state_dict()
    state = optimizer_state(tensors, model, path)
    optimizer.load_state_dict({"state": state, "param_groups": template["param_groups"]})
    set_rng_state(torch.set_rng_state, rng_tensor(tensors, "rng.cpu", path), path)
    cuda_states = [tensors[f"rng.cuda.{i}"] for i in range(len(tensors)) if f"rng.cuda.{i}" in tensors]
    if cuda_states and torch.cuda.is_available():
        set_rng_state(torch.cuda.set_rng_state_all, cuda_states, path)
    if world.distributed:
        set_rng_state(torch.set_rng_state, rng_tensor(tensors, f"rng.cpu.rank{world.rank}", path), path)
        cuda_state = tensors.get(f"rng.cuda.rank{world.rank}")
        if cuda_state is not None and torch.cuda.is_available():
            set_rng_state(lambda rng: torch.cuda.set_rng_state(rng, torch.cuda.current_device()), cuda_state, path)
    scaler_state = decode_json(metadata.get("scaler", "null"), "scaler", path)
    if scaler is not None and scaler_state:
        if not isinstance(scaler_state, dict) or not all(isinstance(v, (int, float)) for v in scaler_state.values()):
            raise TfmError(f"{path}: damaged training state (scaler is not an object of numbers); start a new --run")
        scaler.load_state_dict(scaler_state)
    return counters


def damaged(path: Path, what: str) -> TfmError:
    """The error for a training-state file that is readable but wrong inside."""
    return TfmError(f"{path}: damaged training state ({what}); resume needs the file a run wrote, or start a new --run")


def decode_json(text: object, key: str, path: Path) -> object:
    """The JSON value stored under metadata `key`; TfmError if it is missing or not JSON."""
    if not isinstance(text, str):
        raise damaged(path, f"no {key} metadata")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise damaged(path, f"{key} metadata is not JSON") from None


def decode_counters(text: object, path: Path) -> Counters:
    """The Counters saved in a state file's metadata, each field type-checked; TfmError if damaged."""
    values = decode_json(text, "counters", path)
    if not isinstance(values, dict):
        raise damaged(path, "counters is not a JSON object")
    fields = Counters.__dataclass_fields__
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise damaged(path, f"unknown counter {unknown[0]!r}")
    for name, value in values.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in ("elapsed", "best_value"):
            valid = (number and math.isfinite(value) and value >= 0) if name == "elapsed" else (value is None or number)
        else:
            valid = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not valid:
            raise damaged(path, f"counter {name} = {value!r}")
    return Counters(**values)


def optimizer_state(tensors: dict[str, torch.Tensor], model: Transformer, path: Path) -> dict[int, dict]:
    """The optimizer's per-parameter state from the file's optimizer.* tensors, checked against the model.

    Either every parameter has the same entries (a run that has taken a step), or none has (a fresh
    optimizer). Moments must have their parameter's shape; anything else raises TfmError.
    """
    state: dict[int, dict[str, torch.Tensor]] = {}
    expected_keys: set[str] | None = None
    for index, (name, param) in enumerate(model.named_parameters()):
        prefix = f"optimizer.{name}."
        entries = {key[len(prefix):]: value for key, value in tensors.items() if key.startswith(prefix)}
        if expected_keys is None:
            expected_keys = set(entries)
        if set(entries) != expected_keys:
            missing = sorted(expected_keys ^ set(entries))[0]
            raise damaged(path, f"optimizer state of {name} lacks or adds tensor {missing!r}")
        for key, value in entries.items():
            scalar = key == "step"
            if (value.numel() != 1 if scalar else value.shape != param.shape) or not value.is_floating_point():
                raise damaged(path, f"optimizer.{name}.{key} has shape {tuple(value.shape)} and dtype {value.dtype}")
            if not bool(torch.isfinite(value).all()):
                raise damaged(path, f"optimizer.{name}.{key} holds non-finite values")
        if entries:
            state[index] = entries
    return state


def rng_tensor(tensors: dict[str, torch.Tensor], name: str, path: Path) -> torch.Tensor:
    """The RNG state tensor `name` (a 1-D uint8 byte string); TfmError if it is missing or malformed."""
    value = tensors.get(name)
    if value is None:
        raise damaged(path, f"no tensor {name!r}")
    if value.dtype != torch.uint8 or value.dim() != 1:
        raise damaged(path, f"{name} is not a byte string")
    return value


def set_rng_state(setter, state, path: Path) -> None:
    """Call torch's RNG `setter` with `state`; a state torch rejects raises TfmError naming the file."""
    try:
        setter(state)
    except (RuntimeError, ValueError) as error:
        raise damaged(path, f"RNG state rejected: {error}") from None
