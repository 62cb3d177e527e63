#!/usr/bin/env bash
# Alignments on real text, the whole loop: align the training corpus with eflomal, train English->French
# and French->English with guided alignment toward it (and English->French without, for comparison),
# then measure AER on a hand-aligned gold standard and BLEU on Multi30k test_2016_flickr.
#   bash recipes/alignment/run.sh M30K_FR_DIR GOLD_DIR [RUN_DIR]
# M30K_FR_DIR: Multi30k English-French, lowercased and tokenized, as {train,val,test_2016_flickr}.{en,fr}
#   (data/task1/tok/*.lc.norm.tok.* of github.com/multi30k/dataset, renamed).
# GOLD_DIR: gold.en, gold.fr, gold.talp, prepared as bench/README.md says (WPT-03 Hansards).
# Needs eflomal: pip install -e '.[aligners]'. About 75 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench="$here/../../bench"
m30k="${1:?give the Multi30k en-fr folder first}"
gold="${2:?give the gold folder second}"
run="${3:-runs/alignment}"
threads="${TFM_THREADS:-2}"
mkdir -p "$run/data"
export ALIGN_DATA="$run/data"

echo "== 1/5 data: Multi30k train + the gold sentences (without their links), as aligners are run" >&2
cat "$m30k/train.en" "$gold/gold.en" > "$ALIGN_DATA/train.en"
cat "$m30k/train.fr" "$gold/gold.fr" > "$ALIGN_DATA/train.fr"
cp "$m30k/val.en" "$m30k/val.fr" "$ALIGN_DATA/"
gold_lines=$(wc -l < "$gold/gold.en")

echo "== 2/5 eflomal both directions, symmetrized with grow-diag-final-and: the guidance" >&2
eflomal-align -s "$ALIGN_DATA/train.en" -t "$ALIGN_DATA/train.fr" \
  -f "$ALIGN_DATA/eflomal.fwd" -r "$ALIGN_DATA/eflomal.rev" --overwrite
python "$here/symmetrize.py" "$ALIGN_DATA/eflomal.fwd" "$ALIGN_DATA/eflomal.rev" > "$ALIGN_DATA/train.align"
python "$here/symmetrize.py" "$ALIGN_DATA/eflomal.fwd" "$ALIGN_DATA/eflomal.rev" --transpose > "$ALIGN_DATA/train.align.fr-en"

echo "== 3/5 train: en-fr plain, en-fr guided, fr-en guided" >&2
guided=(--set "data.train_alignment=$ALIGN_DATA/train.align" --set train.alignment_weight=0.1)
tfm train "$here/en-fr.toml" --run "$run/en-fr-plain" --threads "$threads"
tfm train "$here/en-fr.toml" --run "$run/en-fr-guided" --threads "$threads" "${guided[@]}"
tfm train "$here/en-fr.toml" --run "$run/fr-en-guided" --threads "$threads" \
  --set "data.train_src=$ALIGN_DATA/train.fr" --set "data.train_tgt=$ALIGN_DATA/train.en" \
  --set "data.valid_src=$ALIGN_DATA/val.fr" --set "data.valid_tgt=$ALIGN_DATA/val.en" \
  --set "data.train_alignment=$ALIGN_DATA/train.align.fr-en" --set train.alignment_weight=0.1

echo "== 4/5 AER on the gold set ($gold_lines sentences)" >&2
tail -n "$gold_lines" "$ALIGN_DATA/eflomal.fwd" > "$run/eflomal.fwd"
tail -n "$gold_lines" "$ALIGN_DATA/eflomal.rev" > "$run/eflomal.rev"
for name in en-fr-plain en-fr-guided; do
  tfm align -m "$run/$name/checkpoint_last.safetensors" --src "$gold/gold.en" --tgt "$gold/gold.fr" -o "$run/$name.gold.align"
done
tfm align -m "$run/en-fr-guided/checkpoint_last.safetensors" --reverse-model "$run/fr-en-guided/checkpoint_last.safetensors" \
  --symmetrize grow-diag-final-and --src "$gold/gold.en" --tgt "$gold/gold.fr" -o "$run/guided-gdfa.gold.align"
tfm align -m "$run/en-fr-guided/checkpoint_last.safetensors" --reverse-model "$run/fr-en-guided/checkpoint_last.safetensors" \
  --symmetrize intersection --src "$gold/gold.en" --tgt "$gold/gold.fr" -o "$run/guided-intersection.gold.align"
python "$bench/alignment_aer.py" --gold "$gold/gold.talp" --symmetrize "eflomal=$run/eflomal.fwd,$run/eflomal.rev" \
  "tfm-plain=$run/en-fr-plain.gold.align" "tfm-guided=$run/en-fr-guided.gold.align" \
  "tfm-guided-gdfa=$run/guided-gdfa.gold.align" "tfm-guided-intersection=$run/guided-intersection.gold.align" \
  | tee "$run/aer.txt"

echo "== 5/5 BLEU on test_2016_flickr (tokenized, lowercased text: sacrebleu --tokenize none)" >&2
for name in en-fr-plain en-fr-guided; do
  tfm translate -m "$run/$name/checkpoint_last.safetensors" --threads "$threads" \
    < "$m30k/test_2016_flickr.en" > "$run/$name.test.fr"
  echo "$name: $(tfm score -r "$m30k/test_2016_flickr.fr" -i "$run/$name.test.fr" --tokenize none)"
done | tee "$run/bleu.txt"
