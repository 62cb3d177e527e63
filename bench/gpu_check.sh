#!/usr/bin/env bash
# GPU smoke check (under 8 minutes on one H200): the CUDA tests, a short bf16 run of
# recipes/multi30k/de-en-gpu.toml with validation, a fresh-process evaluation of what it saved,
# beam-5 translation of test_2016_flickr on the GPU and its score, and a 2-GPU torchrun when there
# are two GPUs.
#   MULTI30K_DIR=... bash bench/gpu_check.sh [OUT_DIR]
# Settings: GPU_CHECK_MINUTES (training minutes, default 2), GPU_CHECK_DEVICE (default cuda),
# GPU_CHECK_TEST_LINES (test lines to translate, default all), GPU_CHECK_RECIPE (default
# recipes/multi30k/de-en-gpu.toml; a dry run on a CPU can use recipes/tiny.toml), TFM (the tfm command, default
# `python3 -m tfm_cli`). Everything is logged to OUT_DIR/gpu_check.log (default runs/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu_check}"
minutes="${GPU_CHECK_MINUTES:-2}"
device="${GPU_CHECK_DEVICE:-cuda}"
lines="${GPU_CHECK_TEST_LINES:-0}"
recipe="${GPU_CHECK_RECIPE:-recipes/multi30k/de-en-gpu.toml}"
tfm=(${TFM:-python3 -m tfm_cli})
data="${MULTI30K_DIR:?set MULTI30K_DIR to the Multi30k folder}"
export MULTI30K_DIR="$data" PYTHONUNBUFFERED=1
rm -rf "$out/run" && mkdir -p "$out"
log="$out/gpu_check.log"
: >"$log"
say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$log" >&2; }
failures=0
check() { "$@" >>"$log" 2>&1 || { failures=$((failures + 1)); say "FAILED: $*"; }; }

say "machine"
check nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
check python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"

say "1/5 CUDA tests"
check python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_train_validation.py

say "2/5 $recipe for $minutes minutes, validation every 250 updates"
start=$SECONDS
check "${tfm[@]}" train "$recipe" --run "$out/run" --device "$device" \
  --set "train.max_minutes=$minutes" --set train.valid_every=250 --set train.save_every=250 \
  --set train.warmup_steps=500 --set train.log_every=50
say "training took $((SECONDS - start)) s"
grep '"kind": "valid"' "$out/run/metrics.jsonl" >>"$log" 2>&1
tail -n 3 "$out/run/metrics.jsonl" | grep '"kind": "train"' >>"$log" 2>&1

say "3/5 fresh process: greedy BLEU and nll of the last two validated checkpoints vs what training logged"
# Validation ran under bf16 autocast, the fresh evaluation in float32: close, not equal.
check python3 bench/fresh_validation.py "$out/run" --device "$device" --bleu-tolerance 1.0 --nll-tolerance 0.02 --last 2

test_src="$data/test_2016_flickr.de"
if [ "$lines" -gt 0 ]; then head -n "$lines" "$test_src" >"$out/test.de"; head -n "$lines" "$data/test_2016_flickr.en" >"$out/test.en"
else cp "$test_src" "$out/test.de"; cp "$data/test_2016_flickr.en" "$out/test.en"; fi
say "4/5 translate test_2016_flickr (beam 5) on $device, then score"
start=$SECONDS
check "${tfm[@]}" translate -m "$out/run/checkpoint_last.safetensors" --device "$device" -b 5 \
  -i "$out/test.de" -o "$out/test.hyp"
say "translation took $((SECONDS - start)) s"
check "${tfm[@]}" score -r "$out/test.en" -i "$out/test.hyp" --metrics bleu,chrf
check "${tfm[@]}" score -m "$out/run/checkpoint_last.safetensors" --device "$device" --src "$out/test.de" \
  --tgt "$out/test.hyp" -o "$out/test.model_scores"

gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$gpus" -ge 2 ]; then
  say "5/5 torchrun, 2 GPUs, 100 updates"
  check torchrun --standalone --nproc_per_node 2 -m tfm_cli train recipes/multi30k/de-en-gpu.toml \
    --run "$out/ddp" --device cuda --set train.max_steps=100 --set train.valid_every=100
else
  say "5/5 torchrun skipped: $gpus GPU(s)"
fi
say "done: $failures failed step(s)"
exit $((failures > 0))
