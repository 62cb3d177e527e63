# Sourced by run.sh and unseen.sh: the two translation models of the alignment recipes.
# train_both_directions RUN_DIR trains RUN_DIR/en-fr and RUN_DIR/fr-en with en-fr.toml on $ALIGN_DATA's
# train and val text, with $threads threads. A run already in RUN_DIR is resumed: an interrupted one
# continues, a finished one is kept as it is.
train_both_directions() {
  local run="$1" recipe
  recipe="$(dirname "${BASH_SOURCE[0]}")/en-fr.toml"
  train_one() {
    local dir="$1"; shift
    if [ -f "$dir/train_state.safetensors" ]; then
      tfm train --run "$dir" --resume --threads "$threads"
    else
      tfm train "$recipe" --run "$dir" --threads "$threads" "$@"
    fi
  }
  train_one "$run/en-fr"
  train_one "$run/fr-en" \
    --set "data.train_src=$ALIGN_DATA/train.fr" --set "data.train_tgt=$ALIGN_DATA/train.en" \
    --set "data.valid_src=$ALIGN_DATA/val.fr" --set "data.valid_tgt=$ALIGN_DATA/val.en"
}
