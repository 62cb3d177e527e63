#!/usr/bin/env bash
# The quickstart: a synthetic language pair through all six tfm subcommands, on the CPU, in ~2 minutes.
#   bash recipes/quickstart/run.sh [RUN_DIR] [guided] [extra `tfm train` options, e.g. --set train.seed=2]
# RUN_DIR defaults to runs/quickstart; it is recreated. With `guided`, training also teaches one
# cross-attention head the generator's gold word alignments of the training pairs (guided alignment:
# data.train_alignment, train.alignment_weight), and that head aligns from then on.
# Results (test BLEU, alignment agreement with the gold alignment) are printed at the end.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
run="${1:-runs/quickstart}"
mode="${2:-plain}"
case "$mode" in
  plain|guided) ;;
  *) echo "error: the second argument is \`guided\` or nothing, got '$mode'" >&2; exit 2 ;;
esac
shift $(( $# < 2 ? $# : 2 ))
threads="${TFM_THREADS:-2}"
rm -rf "$run" && mkdir -p "$run"
data="$run/data"
start=$SECONDS

echo "== 1/7 generate a synthetic language pair (gold alignments in $data/test.align)" >&2
python "$here/generate.py" "$data"

echo "== 2/7 tfm tokenize train: one joint sentencepiece model" >&2
tfm tokenize train "$data/train.src" "$data/train.tgt" -o "$run/spm" --vocab-size 200

echo "== 3/7 tfm train ($mode)" >&2
guidance=()
if [ "$mode" = guided ]; then
  guidance=(--set "data.train_alignment=$data/train.align" --set train.alignment_weight=0.5)
fi
tfm train "$here/recipe.toml" --run "$run/train" --threads "$threads" \
  --set "data.train_src=$data/train.src" --set "data.train_tgt=$data/train.tgt" \
  --set "data.valid_src=$data/valid.src" --set "data.valid_tgt=$data/valid.tgt" \
  --set "tokenizer.src_model=$run/spm.model" ${guidance[@]+"${guidance[@]}"} "$@"

echo "== 4/7 tfm average: the last three checkpoints" >&2
tfm average --run "$run/train" --last 3 -o "$run/average.safetensors"

echo "== 5/7 tfm translate: the held-out test set from stdin, beam 5, with word alignments" >&2
tfm translate -m "$run/average.safetensors" --threads "$threads" --alignment < "$data/test.src" > "$run/test.aligned"
cut -f1 "$run/test.aligned" > "$run/test.hyp"

echo "== 6/7 tfm score" >&2
tfm score -r "$data/test.tgt" -i "$run/test.hyp"
tfm score -r "$data/test.tgt" -i "$run/test.hyp" --json > "$run/score.json"

echo "== 7/7 tfm inspect-attention: which source word each target word looks at" >&2
tfm inspect-attention -m "$run/average.safetensors" --words "my happy teacher sees two small dogs"

echo "== summary ($((SECONDS - start)) s)" >&2
python "$here/summarize.py" "$run/score.json" "$run/test.aligned" "$data/test.tgt" "$data/test.align"
