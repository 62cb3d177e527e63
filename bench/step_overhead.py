"""How much of one decoding step is Python around the operators: tfm's step against the same operators
called with as little Python as possible, and (with --compile) against torch.compile of the step.

For one sentence with --rows decoder rows (8: a beam of 8; 1: greedy), this times
`TransformerDecoder.step` (tfm's step: modules, their checks, the search's row handling) against
`bare_step`, which calls the same operators on the same tensors in the same order (packed oneDNN
products, LayerNorm, the explicit attention formula, the same caches), so its log-probs must be the same
bits: the script checks that they are. The difference is what tfm's Python adds around the operators.
The two alternate, --rounds times, --steps steps each; medians.

With --compile it also times `plain_step`, the same computation written as one function of tensors (the
caches grow by concatenation; products by F.linear on the plain weights), eager and compiled by
torch.compile (inductor, dynamic shapes, weights frozen into the graph), and reports the compile time
and the largest difference of the compiled log-probs from the eager ones (compiled kernels sum in
other orders, so they are not the same bits).

Usage: python bench/step_overhead.py --model CKPT [--rows 8] [--threads 2] [--steps 30] [--rounds 12]
       [--compile]
Post-norm models with one source width (tfm's recipes) only. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tfm_cli.checkpoints.format import load_model, read_checkpoint
from tfm_cli.inference.decoding import TransformerDecoder, source_batch
from tfm_cli.model import Transformer
from tfm_cli.model.kernels import row_bucket


def packed_product(x: torch.Tensor, layer: torch.nn.Module, activation: str = "none") -> torch.Tensor:
    """x (R, in) -> (R, out) by the layer's packed oneDNN weight, rows padded as kernels.packed_linear pads them."""
    count = x.size(0)
    missing = row_bucket(count) - count
    if missing:
        x = torch.cat([x, x.new_zeros(missing, x.size(1))])
    output = torch.ops.mkldnn._linear_pointwise(x, layer.packed_weight, layer.bias, activation, [], "")
    return output[:count] if missing else output


def bare_step(model: Transformer, tokens: torch.Tensor, decoder: TransformerDecoder) -> torch.Tensor:
    """tokens (R,) -> (R, V) log-probs: decoder.step's operators with the least Python around them."""
    config, state = model.config, decoder.state
    rows, d_model, n_heads = tokens.size(0), config.d_model, config.n_heads
    part = state.parts[0]
    x = (F.embedding(tokens, model.tgt_embed.weight) * math.sqrt(d_model) + model.positions[state.position])
    for layer, cache, cross in zip(model.decoder_layers, state.self_caches, part.cross_caches):
        projected = packed_product(x, layer.self_attn.qkv_proj)
        queries = projected[:, :d_model].view(rows, 1, n_heads, -1).transpose(1, 2)
        keys, values = cache.append(projected[:, d_model:].view(rows, 1, 2, n_heads, -1).permute(2, 0, 3, 1, 4))
        weights = torch.softmax((queries @ keys.transpose(-2, -1)).div_(math.sqrt(d_model // n_heads)), dim=-1)
        attended = packed_product((weights @ values).view(rows, d_model), layer.self_attn.out_proj)
        norm = layer.self_attn_sublayer.norm
        x = F.layer_norm(x + attended, (d_model,), norm.weight, norm.bias, norm.eps)
        groups = cross.keys.size(0)
        queries = packed_product(x, layer.cross_attn.q_proj).view(groups, rows // groups, n_heads, -1).transpose(1, 2)
        scores = (queries @ cross.keys.transpose(-2, -1)).div_(math.sqrt(d_model // n_heads))
        scores.masked_fill_(~part.mask, float("-inf"))
        attended = (torch.softmax(scores, dim=-1) @ cross.values).permute(0, 2, 1, 3).reshape(rows, d_model)
        norm = layer.cross_attn_sublayer.norm
        x = F.layer_norm(x + packed_product(attended, layer.cross_attn.out_proj), (d_model,), norm.weight, norm.bias, norm.eps)
        hidden = packed_product(x, layer.ffn.linear1, "relu")
        norm = layer.ffn_sublayer.norm
        x = F.layer_norm(x + packed_product(hidden, layer.ffn.linear2), (d_model,), norm.weight, norm.bias, norm.eps)
    state.position += 1
    logits = packed_product(x, model.output_proj)
    return torch.log_softmax(logits, dim=-1, out=logits)


def plain_step(
    model: Transformer, tokens: torch.Tensor, position: torch.Tensor, caches: list[torch.Tensor],
    cross_keys: list[torch.Tensor], cross_values: list[torch.Tensor], mask: torch.Tensor,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One step as a function of tensors: tokens (R,), position (D,) its positional row, caches per layer
    (2, R, H, t, Dh), the memory's keys/values (1, H, S, Dh), mask (1, 1, 1, S) -> ((R, V) log-probs, caches)."""
    config = model.config
    rows, d_model, n_heads = tokens.size(0), config.d_model, config.n_heads
    head_scale = math.sqrt(d_model // n_heads)
    x = model.tgt_embed.weight[tokens] * math.sqrt(d_model) + position
    grown = []
    for index, layer in enumerate(model.decoder_layers):
        attention = layer.self_attn
        projected = F.linear(x, attention.qkv_proj.weight, attention.qkv_proj.bias)
        queries = projected[:, :d_model].view(rows, n_heads, 1, -1)
        keys_values = torch.cat([caches[index], projected[:, d_model:].view(rows, 2, n_heads, -1).transpose(0, 1)[..., None, :]], dim=3)
        grown.append(keys_values)
        weights = torch.softmax(queries @ keys_values[0].transpose(-2, -1) / head_scale, dim=-1)
        attended = F.linear((weights @ keys_values[1]).reshape(rows, d_model), attention.out_proj.weight, attention.out_proj.bias)
        norm = layer.self_attn_sublayer.norm
        x = F.layer_norm(x + attended, (d_model,), norm.weight, norm.bias, norm.eps)
        cross = layer.cross_attn
        queries = F.linear(x, cross.q_proj.weight, cross.q_proj.bias).view(1, rows, n_heads, -1).transpose(1, 2)
        scores = (queries @ cross_keys[index].transpose(-2, -1) / head_scale).masked_fill(~mask, float("-inf"))
        attended = (torch.softmax(scores, dim=-1) @ cross_values[index]).transpose(1, 2).reshape(rows, d_model)
        norm = layer.cross_attn_sublayer.norm
        x = F.layer_norm(x + F.linear(attended, cross.out_proj.weight, cross.out_proj.bias), (d_model,), norm.weight, norm.bias, norm.eps)
        ffn = layer.ffn
        hidden = F.relu(F.linear(x, ffn.linear1.weight, ffn.linear1.bias))
        norm = layer.ffn_sublayer.norm
        x = F.layer_norm(x + F.linear(hidden, ffn.linear2.weight, ffn.linear2.bias), (d_model,), norm.weight, norm.bias, norm.eps)
    logits = F.linear(x, model.output_proj.weight, getattr(model.output_proj, "bias", None))
    return torch.log_softmax(logits, dim=-1), grown


def time_packed_steps(loaded, src: torch.Tensor, rows: int, steps: int, rounds: int) -> dict[str, list[float]]:
    """ms per step of tfm's step and bare_step, alternating; raises if their log-probs differ."""
    times: dict[str, list[float]] = {"tfm step": [], "bare step": []}
    for _ in range(rounds):
        outputs = {}
        for name in times:
            decoder = TransformerDecoder(loaded.model, src)
            decoder.start(rows, grouped=True)
            tokens, steps_out = torch.full((rows,), loaded.config.bos_id), []
            start = time.perf_counter()
            for _ in range(steps):
                log_probs = decoder.step(tokens) if name == "tfm step" else bare_step(loaded.model, tokens, decoder)
                tokens = log_probs.argmax(-1)
                steps_out.append(log_probs)
            times[name].append((time.perf_counter() - start) / steps * 1e3)
            outputs[name] = steps_out
        if not all(torch.equal(a, b) for a, b in zip(*outputs.values())):
            raise SystemExit("bare_step's log-probs differ from tfm's step: it no longer calls the same operators")
    return times


def time_plain_steps(model_path: Path, rows: int, steps: int, rounds: int) -> tuple[dict[str, list[float]], float, float]:
    """ms per step of plain_step eager and compiled; the compile time (s) and the largest |difference|."""
    import torch._inductor.config as inductor_config

    checkpoint = read_checkpoint(model_path)
    model = Transformer.with_weights(checkpoint.config, checkpoint.weights).eval()
    config = model.config
    heads, head_dim, width = config.n_heads, config.d_model // config.n_heads, 16
    generator = torch.Generator().manual_seed(0)
    cross_keys = [torch.randn(1, heads, width, head_dim, generator=generator) for _ in model.decoder_layers]
    cross_values = [torch.randn(1, heads, width, head_dim, generator=generator) for _ in model.decoder_layers]
    mask = torch.ones(1, 1, 1, width, dtype=torch.bool)

    def run(step, count: int) -> tuple[float, list[torch.Tensor]]:
        caches = [torch.zeros(2, rows, heads, 0, head_dim) for _ in model.decoder_layers]
        tokens, outputs = torch.full((rows,), config.bos_id), []
        start = time.perf_counter()
        for position in range(count):
            log_probs, caches = step(model, tokens, model.positions[position], caches, cross_keys, cross_values, mask)
            tokens = log_probs.argmax(-1)
            outputs.append(log_probs)
        return (time.perf_counter() - start) / count * 1e3, outputs

    inductor_config.freezing = True
    compiled = torch.compile(plain_step, dynamic=True)
    start = time.perf_counter()
    run(compiled, 3)
    compile_seconds = time.perf_counter() - start
    times: dict[str, list[float]] = {"plain step, eager (F.linear)": [], "plain step, torch.compile": []}
    difference = 0.0
    for _ in range(rounds):
        eager_ms, eager_out = run(plain_step, steps)
        compiled_ms, compiled_out = run(compiled, steps)
        times["plain step, eager (F.linear)"].append(eager_ms)
        times["plain step, torch.compile"].append(compiled_ms)
        difference = max(difference, max((a - b).abs().max().item() for a, b in zip(eager_out, compiled_out)))
    return times, compile_seconds, difference


def main() -> None:
    """Time the steps and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of plain_step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    if loaded.config.norm_first:
        raise SystemExit("bare_step is written for post-norm models (tfm's recipes)")
    src = source_batch([list(range(10, 24))], loaded.config)  # one 14-token source: one width
    with torch.inference_mode():
        times = time_packed_steps(loaded, src, args.rows, args.steps, args.rounds)
        extra = ""
        if args.compile:
            plain_times, compile_seconds, difference = time_plain_steps(args.model, args.rows, args.steps, args.rounds)
            times.update(plain_times)
            extra = f"; compile {compile_seconds:.1f} s, compiled log-probs differ from eager by up to {difference:.2e}"
    print(f"# {args.rows} rows, {args.threads} threads, {args.steps} steps x {args.rounds} rounds, "
          f"medians{extra}; tfm step and bare step: identical log-probs")
    print("| step | ms per step (median) | min | x tfm step |")
    print("|---|---:|---:|---:|")
    reference = statistics.median(times["tfm step"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {min(values):.2f} | {reference / median:.2f}x |")


if __name__ == "__main__":
    main()
