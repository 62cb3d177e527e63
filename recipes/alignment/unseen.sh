#!/usr/bin/env bash
# Alignments of sentences the models never saw (the inductive protocol): translation models and aligners
# learn from Multi30k English-French alone, then align the WPT-03 Hansards gold sentences. The aligners'
# teacher is chosen on the 37 trial sentences; the 447 test sentences are scored once, with that choice.
# eflomal, the peer, can only align sentences in its own corpus: it gets the trial and test sentences
# appended, as a user aligning new text with it would do.
#   bash recipes/alignment/unseen.sh M30K_FR_DIR GOLD_DIR TRIAL_DIR [RUN_DIR]
# M30K_FR_DIR: as for run.sh (Multi30k en-fr, lowercased and tokenized, {train,val}.{en,fr}).
# GOLD_DIR, TRIAL_DIR: gold.en, gold.fr, gold.talp of the test and the trial set (bench/README.md).
# Needs eflomal: pip install -e '.[aligners]'. About 100 minutes on 2 cores; a rerun keeps what is done.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench="$here/../../bench"
. "$here/models.sh"
m30k="${1:?give the Multi30k en-fr folder first}"
gold="${2:?give the test gold folder second}"
trial="${3:?give the trial gold folder third}"
run="${4:-runs/alignment-unseen}"
threads="${TFM_THREADS:-2}"
eflomal_runs="${EFLOMAL_RUNS:-12}"
mkdir -p "$run/data" "$run/peers"
export ALIGN_DATA="$run/data"

echo "== 1/8 data: Multi30k train alone; no pair may hold a trial or test sentence" >&2
cp "$m30k/train.en" "$m30k/train.fr" "$m30k/val.en" "$m30k/val.fr" "$ALIGN_DATA/"
python - "$ALIGN_DATA" "$gold" "$trial" <<'EOF'
import sys
from pathlib import Path
data, *gold_dirs = map(Path, sys.argv[1:])
held = {(side, line.strip()) for folder in gold_dirs for side in ("en", "fr")
        for line in (folder / f"gold.{side}").read_text(encoding="utf-8").splitlines()}
for side in ("en", "fr"):
    for split in ("train", "val"):
        seen = [line for line in (data / f"{split}.{side}").read_text(encoding="utf-8").splitlines() if (side, line.strip()) in held]
        if seen:
            sys.exit(f"{data / f'{split}.{side}'} holds {len(seen)} gold sentences; remove them and run again")
EOF

echo "== 2/8 eflomal on Multi30k alone, $eflomal_runs runs: the two candidate teachers" >&2
# The alignment recipe's teacher (the links at least 3 of 12 runs' intersections have) and the Multi30k
# recipe's (at least 6 of 12 runs' grow-diag-final-and); the trial set picks one in step 5.
# eflomal_runs EN FR FOLDER: $eflomal_runs runs of eflomal on EN/FR, FOLDER/eflomalN.{fwd,rev} (those done are
# kept), and their file names in the array run_files, forward and reverse of each run in turn.
eflomal_runs() {
  run_files=()
  for number in $(seq 1 "$eflomal_runs"); do
    if [ ! -s "$3/eflomal$number.rev" ]; then
      eflomal-align -s "$1" -t "$2" -f "$3/eflomal$number.fwd" -r "$3/eflomal$number.rev" --overwrite
    fi
    run_files+=("$3/eflomal$number.fwd" "$3/eflomal$number.rev")
  done
}
eflomal_runs "$ALIGN_DATA/train.en" "$ALIGN_DATA/train.fr" "$ALIGN_DATA"
teach() {  # NAME METHOD AT_LEAST
  python "$here/symmetrize.py" "${run_files[@]}" --method "$2" --at-least "$3" > "$ALIGN_DATA/$1.en-fr"
  python "$here/symmetrize.py" "${run_files[@]}" --method "$2" --at-least "$3" --transpose > "$ALIGN_DATA/$1.fr-en"
}
teach intersection-vote intersection 3
teach gdfa-vote grow-diag-final-and 6

echo "== 3/8 train en-fr and fr-en on Multi30k alone" >&2
train_both_directions "$run"

echo "== 4/8 an aligner per model and teacher (train-aligner's defaults: 2% held out, early stopping)" >&2
for teacher in intersection-vote gdfa-vote; do
  for pair in en-fr fr-en; do
    src="${pair%-*}"; tgt="${pair#*-}"
    [ -f "$run/$pair.$teacher.aligner.safetensors" ] && continue
    tfm train-aligner -m "$run/$pair/checkpoint_last.safetensors" --threads "$threads" \
      --src "$ALIGN_DATA/train.$src" --tgt "$ALIGN_DATA/train.$tgt" --links "$ALIGN_DATA/$teacher.$pair" \
      -o "$run/$pair.$teacher.aligner.safetensors"
  done
done

# Links of a gold set's pairs in four modes: OUT_PREFIX TEACHER GOLD_FOLDER
align_modes() {
  local out="$1" teacher="$2" folder="$3"
  local forward="$run/en-fr.$teacher.aligner.safetensors" reverse="$run/fr-en.$teacher.aligner.safetensors"
  local align=(tfm align --threads "$threads" --src "$folder/gold.en" --tgt "$folder/gold.fr")
  "${align[@]}" -m "$forward" -o "$out.en-fr"
  "${align[@]}" -m "$forward" --reverse-model "$reverse" --symmetrize grow-diag-final-and -o "$out.gdfa"
  "${align[@]}" -m "$forward" --reverse-model "$reverse" --symmetrize intersection -o "$out.intersection"
  tfm align --threads "$threads" -m "$reverse" --src "$folder/gold.fr" --tgt "$folder/gold.en" \
    | python -c "import sys; [print(' '.join('-'.join(link.split('-')[::-1]) for link in line.split())) for line in sys.stdin]" \
    > "$out.fr-en"  # French-English links turned into English-French ones
}
score_modes() {  # GOLD_TALP OUT_PREFIX
  python "$bench/alignment_aer.py" --gold "$1" "en-fr=$2.en-fr" "fr-en=$2.fr-en" \
    "grow-diag-final-and=$2.gdfa" "intersection=$2.intersection"
}

echo "== 5/8 the teacher, chosen on the trial set (mean AER of the four modes)" >&2
for teacher in intersection-vote gdfa-vote; do
  align_modes "$run/trial.$teacher" "$teacher" "$trial"
  score_modes "$trial/gold.talp" "$run/trial.$teacher" > "$run/trial.$teacher.aer"
done
chosen=$(python - "$run" <<'EOF'
import statistics, sys
from pathlib import Path
means = {}
for teacher in ("intersection-vote", "gdfa-vote"):
    rows = [line.split("|") for line in (Path(sys.argv[1]) / f"trial.{teacher}.aer").read_text().splitlines()]
    means[teacher] = statistics.mean(float(row[2]) for row in rows if len(row) > 3 and row[2].strip()[:1].isdigit())
    print(f"trial: {teacher} mean AER {means[teacher]:.2f}", file=sys.stderr)
print(min(means, key=means.get))
EOF
)
echo "$chosen" > "$run/chosen-teacher.txt"
echo "chosen on the trial set: $chosen" >&2

echo "== 6/8 the test set, once, with the chosen teacher's aligners; and the model's attention" >&2
align_modes "$run/test.$chosen" "$chosen" "$gold"
tfm align --threads "$threads" -m "$run/en-fr/checkpoint_last.safetensors" --src "$gold/gold.en" --tgt "$gold/gold.fr" \
  -o "$run/test.attention.en-fr"
{ score_modes "$gold/gold.talp" "$run/test.$chosen"
  python "$bench/alignment_aer.py" --gold "$gold/gold.talp" "attention-en-fr=$run/test.attention.en-fr"; } | tee "$run/test.aer"

echo "== 7/8 the peer: eflomal with the test and trial sentences appended to its corpus, $eflomal_runs runs" >&2
cat "$ALIGN_DATA/train.en" "$gold/gold.en" "$trial/gold.en" > "$run/peers/all.en"
cat "$ALIGN_DATA/train.fr" "$gold/gold.fr" "$trial/gold.fr" > "$run/peers/all.fr"
eflomal_runs "$run/peers/all.en" "$run/peers/all.fr" "$run/peers"
peer_files=("${run_files[@]}")
trial_lines=$(wc -l < "$trial/gold.en")
python "$bench/eflomal_peers.py" --gold "$gold/gold.talp" --lines-after "$trial_lines" --at-least 3 "${peer_files[@]}" \
  | tee "$run/test.eflomal.aer"

echo "== 8/8 the peer's other route: priors from its Multi30k runs (eflomal-makepriors), the test sentences aligned alone" >&2
# eflomal still samples over the 447 sentences it aligns (their words, not their links); the priors carry
# what each Multi30k run learnt.
mkdir -p "$run/priors"
prior_files=()
for number in $(seq 1 "$eflomal_runs"); do
  if [ ! -s "$run/priors/gold$number.rev" ]; then
    eflomal-makepriors -s "$ALIGN_DATA/train.en" -t "$ALIGN_DATA/train.fr" -f "$ALIGN_DATA/eflomal$number.fwd" \
      -r "$ALIGN_DATA/eflomal$number.rev" -p "$run/priors/run$number.priors"
    eflomal-align -s "$gold/gold.en" -t "$gold/gold.fr" --priors "$run/priors/run$number.priors" \
      -f "$run/priors/gold$number.fwd" -r "$run/priors/gold$number.rev" --overwrite
  fi
  prior_files+=("$run/priors/gold$number.fwd" "$run/priors/gold$number.rev")
done
python "$bench/eflomal_peers.py" --gold "$gold/gold.talp" --at-least 3 "${prior_files[@]}" | tee "$run/test.eflomal-priors.aer"
