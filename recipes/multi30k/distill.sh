#!/usr/bin/env bash
# A student distilled from the Multi30k recipe's teacher (sequence-level knowledge distillation, Kim & Rush
# 2016): the teacher translates the training sources with its own [decode] settings, and a student learns
# those translations with the recipe's settings (the same vocabulary: the teacher's tokenizer; a deep
# encoder and shallow decoder, Kasai et al. 2021, through the depth variables below); then it is averaged, and
# test_2016_flickr is translated greedily and with the recipe's beam, and scored.
#   bash recipes/multi30k/distill.sh de-en|en-de TEACHER_RUN[,TEACHER_RUN...] [STUDENT_RUN] [extra `tfm train` options]
# TEACHER_RUN: a folder run.sh made (its average.safetensors and train/spm.model); several, comma-separated,
# translate as one ensemble. STUDENT_RUN defaults to runs/multi30k-<direction>-student.
# The distilled targets are written with `tfm translate --resume`: after an interruption, rerun the same
# command and the translation goes on where it stopped (the student's training starts afresh).
# STUDENT_ENCODER_LAYERS and STUDENT_DECODER_LAYERS set the student's depth (default: the recipe's 3 and 3);
# MIX=1 trains on the original targets as well as the distilled ones (data.more_train). Neither was chosen
# on val: the 3 + 3 de-en student decodes greedily at the teacher's beam quality, a 6 + 1 one learnt far
# slower in the recipe's hour (RESULTS.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
direction="${1:-}"
case "$direction" in
  de-en) src=de tgt=en ;;
  en-de) src=en tgt=de ;;
  *) echo "error: give the direction first: bash recipes/multi30k/distill.sh de-en|en-de TEACHER_RUN [STUDENT_RUN]" >&2; exit 2 ;;
esac
teachers="${2:-}"
if [ -z "$teachers" ]; then
  echo "error: give the teacher's run folder second (what recipes/multi30k/run.sh $direction wrote)" >&2; exit 2
fi
student="${3:-runs/multi30k-$direction-student}"
shift $(( $# < 3 ? $# : 3 ))
threads="${TFM_THREADS:-2}"

models=()
IFS=, read -r -a teacher_runs <<< "$teachers"
for teacher in "${teacher_runs[@]}"; do
  if [ ! -f "$teacher/average.safetensors" ]; then
    echo "error: $teacher/average.safetensors is missing; run bash recipes/multi30k/run.sh $direction $teacher first" >&2
    exit 1
  fi
  models+=(-m "$teacher/average.safetensors")
done
tokenizer="${teacher_runs[0]}/train/spm.model"
data="$(python "$here/fetch.py")"
export MULTI30K_DIR="$data"
mkdir -p "$student"
start=$SECONDS

distilled="$student/distilled.$tgt"
newer_than_teachers=1
for teacher in "${teacher_runs[@]}"; do
  if [ ! "$distilled" -nt "$teacher/average.safetensors" ]; then newer_than_teachers=0; fi
done
if [ "$newer_than_teachers" = 1 ]; then
  echo "== 1/4 $distilled is there, newer than the teachers: kept" >&2
else
  echo "== 1/4 the teacher translates train.$src (its [decode] settings; --resume goes on after an interruption)" >&2
  tfm translate "${models[@]}" -i "$data/train.$src" -o "$distilled" --resume --progress --threads "$threads"
fi

echo "== 2/4 tfm train: the student on the distilled targets" >&2
student_settings=(
  --set "data.train_tgt=$distilled"
  --set "tokenizer.src_model=$tokenizer"
  --set "model.n_enc_layers=${STUDENT_ENCODER_LAYERS:-3}"
  --set "model.n_dec_layers=${STUDENT_DECODER_LAYERS:-3}"
)
if [ "${MIX:-0}" = 1 ]; then
  student_settings+=(--set "data.more_train=[{src=\"$data/train.$src\", tgt=\"$data/train.$tgt\"}]")
fi
rm -rf "$student/train"
tfm train "$here/$direction.toml" --run "$student/train" --threads "$threads" "${student_settings[@]}" "$@"

echo "== 3/4 tfm average: the last two checkpoints" >&2
tfm average --run "$student/train" --last 2 -o "$student/average.safetensors"

echo "== 4/4 test_2016_flickr.$src: greedy and the recipe's beam, scored against test_2016_flickr.$tgt" >&2
: > "$student/test_2016_flickr.score"
for search in greedy beam; do
  beam=()
  if [ "$search" = greedy ]; then beam=(--beam 1); fi
  tfm translate -m "$student/average.safetensors" --threads "$threads" ${beam[@]+"${beam[@]}"} \
    < "$data/test_2016_flickr.$src" > "$student/test_2016_flickr.$tgt.$search.hyp"
  echo "$search: $(tfm score -r "$data/test_2016_flickr.$tgt" -i "$student/test_2016_flickr.$tgt.$search.hyp" --metrics bleu,chrf | tr '\n' ' ')" \
    | tee -a "$student/test_2016_flickr.score"
done
echo "== done in $((SECONDS - start)) s" >&2
