#!/usr/bin/env bash
# GPU check, sized to finish within 8 minutes on one H100 or H200: the CUDA tests, a short bf16 run of
# recipes/multi30k/de-en-gpu.toml with validation, a fresh-process evaluation of what it saved,
# beam-5 translation of test_2016_flickr on the GPU and its score, whole processes of `tfm translate`
# against CTranslate2 and MarianMTModel on the same GPU (bench/whole_process.py --device cuda: tfm
# float32 and bf16 against CTranslate2 float32, bfloat16 and float16 and MarianMTModel float32 and
# bfloat16), training throughput and MFU of tfm's step against torch.nn.Transformer in bf16 autocast
# for the Multi30k shape and a Transformer-base shape (bench/train_vs_reference.py --device cuda),
# and a 2-GPU torchrun when there are two GPUs.
#   MULTI30K_DIR=... bash bench/gpu_check.sh [OUT_DIR]
# Its GPU steps have not yet run on a GPU; a dry run on a CPU passes every step but nvidia-smi:
#   MULTI30K_DIR=../shared/data/multi30k GPU_CHECK_DEVICE=cpu GPU_CHECK_RECIPE=<tiny.toml with max_positions 256> \
#   GPU_CHECK_TEST_LINES=60 GPU_CHECK_MINUTES=0.3 TFM="python -m tfm_cli" \
#   GPU_CHECK_TRAIN_BENCH="--max-tokens 512 --steps 1 --rounds 1 --threads 2" bash bench/gpu_check.sh /tmp/gc
# Settings: GPU_CHECK_MINUTES (training minutes, default 1), GPU_CHECK_DEVICE (default cuda),
# GPU_CHECK_TEST_LINES (test lines to translate, default all), GPU_CHECK_RECIPE (default
# recipes/multi30k/de-en-gpu.toml; a dry run on a CPU can use recipes/tiny.toml),
# GPU_CHECK_WHOLE_COPIES (the test set repeated this many times for the whole-process rows, default 1),
# GPU_CHECK_TRAIN_BENCH (extra arguments of train_vs_reference.py, e.g. a CPU dry run's
# "--max-tokens 512 --steps 1 --rounds 1"), TFM (the tfm command, default `python3 -m tfm_cli`).
# Everything is logged to OUT_DIR/gpu_check.log (default runs/gpu_check); the benches' tables go to
# OUT_DIR/whole_process.md and OUT_DIR/train_vs_reference.md.
#
# On this workplace's GPU machines (`run` of the device tool) neither ../shared nor CTranslate2 is
# there; bring both, once, from the repository root:
#   echo /.gpu/ >> .git/info/exclude; mkdir -p .gpu/whl && cp -r ../shared/data/multi30k .gpu/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .gpu/whl ctranslate2==4.8.5
# and run (carry [".gpu"]; the run folder's checkpoints are too large to come back, so only the tables and the log do):
#   pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl && export PYTHONPATH=/tmp/site;
#   MULTI30K_DIR=.gpu/multi30k bash bench/gpu_check.sh /tmp/gc; cp /tmp/gc/*.md /tmp/gc/gpu_check.log $OUT/
# The PyPI wheel of CTranslate2 4.8.5 loads libcublas.so.12 (CUDA 12) at run time: on a machine
# with only CUDA 13's libraries its GPU rows say that it failed (the MarianMTModel rows still run).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu_check}"
minutes="${GPU_CHECK_MINUTES:-1}"
device="${GPU_CHECK_DEVICE:-cuda}"
lines="${GPU_CHECK_TEST_LINES:-0}"
recipe="${GPU_CHECK_RECIPE:-recipes/multi30k/de-en-gpu.toml}"
copies="${GPU_CHECK_WHOLE_COPIES:-1}"
train_bench=(${GPU_CHECK_TRAIN_BENCH:-})
tfm_command="${TFM:-python3 -m tfm_cli}"
tfm=($tfm_command)
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
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
case "$gpu_name" in  # the datasheet's dense bf16 TFLOP/s, for MFU against it
  *H200*|*"H100 80GB HBM3"*|*"H100 SXM"*) nominal=(--nominal-tflops 989) ;;
  *"H100 PCIe"*|*"H100 NVL"*) nominal=(--nominal-tflops 756) ;;
  *A100*) nominal=(--nominal-tflops 312) ;;
  *) nominal=() ;;
esac

say "1/7 CUDA tests"
check python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_train_validation.py

say "2/7 $recipe for $minutes minutes, validation every 150 updates"
start=$SECONDS
check "${tfm[@]}" train "$recipe" --run "$out/run" --device "$device" \
  --set "train.max_minutes=$minutes" --set train.valid_every=150 --set train.save_every=150 \
  --set train.warmup_steps=500 --set train.log_every=50
say "training took $((SECONDS - start)) s"
grep '"kind": "valid"' "$out/run/metrics.jsonl" >>"$log" 2>&1
tail -n 3 "$out/run/metrics.jsonl" | grep '"kind": "train"' >>"$log" 2>&1

say "3/7 fresh process: greedy BLEU and nll of the last two validated checkpoints vs what training logged"
# Validation ran under bf16 autocast, the fresh evaluation in float32: close, not equal.
check python3 bench/fresh_validation.py "$out/run" --device "$device" --bleu-tolerance 1.0 --nll-tolerance 0.02 --last 2

test_src="$data/test_2016_flickr.de"
if [ "$lines" -gt 0 ]; then head -n "$lines" "$test_src" >"$out/test.de"; head -n "$lines" "$data/test_2016_flickr.en" >"$out/test.en"
else cp "$test_src" "$out/test.de"; cp "$data/test_2016_flickr.en" "$out/test.en"; fi
say "4/7 translate test_2016_flickr (beam 5) on $device, then score"
start=$SECONDS
check "${tfm[@]}" translate -m "$out/run/checkpoint_last.safetensors" --device "$device" -b 5 \
  -i "$out/test.de" -o "$out/test.hyp"
say "translation took $((SECONDS - start)) s"
check "${tfm[@]}" score -r "$out/test.en" -i "$out/test.hyp" --metrics bleu,chrf
check "${tfm[@]}" score -m "$out/run/checkpoint_last.safetensors" --device "$device" --src "$out/test.de" \
  --tgt "$out/test.hyp" -o "$out/test.model_scores"

say "5/7 whole processes on $device: tfm translate vs CTranslate2 and MarianMTModel, the test set x $copies, beam 5"
: >"$out/whole.de"; : >"$out/whole.en"
for _ in $(seq "$copies"); do cat "$out/test.de" >>"$out/whole.de"; cat "$out/test.en" >>"$out/whole.en"; done
if python3 -c "import ctranslate2" >>"$log" 2>&1; then
  if [ "$device" = cpu ]; then dtypes=float32; else dtypes=float32,bf16; fi
  python3 bench/whole_process.py --model "$out/run/checkpoint_last.safetensors" --device "$device" \
    --source "$out/whole.de" --reference "$out/whole.en" --dtypes "$dtypes" --beams 5 --runs 2 \
    --ct2-batch-size 128 --one-line-runs 2 --memory-batch-sizes "" --workdir "$out/whole" --tfm "$tfm_command" \
    >"$out/whole_process.md" 2>>"$log" || { failures=$((failures + 1)); say "FAILED: whole_process.py"; }
  cat "$out/whole_process.md" >>"$log"
else
  failures=$((failures + 1)); say "FAILED: ctranslate2 is not importable (bring its wheel: see this script's header)"
fi

say "6/7 training step vs torch.nn.Transformer on $device, bf16 autocast: Multi30k shape, then Transformer-base"
: >"$out/train_vs_reference.md"
for shape in multi30k base; do
  python3 bench/train_vs_reference.py --device "$device" --bf16 --shape "$shape" --max-tokens 8192 --steps 8 \
    --rounds 3 --workdir "$out/train_bench" "${nominal[@]}" "${train_bench[@]}" >>"$out/train_vs_reference.md" 2>>"$log" \
    || { failures=$((failures + 1)); say "FAILED: train_vs_reference.py --shape $shape"; }
done
cat "$out/train_vs_reference.md" >>"$log"

gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$gpus" -ge 2 ]; then
  say "7/7 torchrun, 2 GPUs, 100 updates"
  check torchrun --standalone --nproc_per_node 2 -m tfm_cli train recipes/multi30k/de-en-gpu.toml \
    --run "$out/ddp" --device cuda --set train.max_steps=100 --set train.valid_every=100
else
  say "7/7 torchrun skipped: $gpus GPU(s)"
fi
say "done: $failures failed step(s)"
exit $((failures > 0))
