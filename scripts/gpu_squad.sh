#!/usr/bin/env bash
# SQuAD 2.0 alone on a GPU: bert-base-uncased fine-tuned on the span task for 2 epochs at lr 3e-5, batch 32, windows
# of 384 tokens sharing 128, answers of at most 30 tokens, the no-answer threshold chosen on dev (as Devlin et al.
# chose theirs). Untested here. The BERT paper's SQuAD 2.0 run was BERT-Large, 2 epochs at lr 5e-5, batch 48; lr 3e-5
# and the window sizes are those of the BERT repository's run_squad.py example; seed 002 fine-tuned bert-base at
# lr 1e-5, batch 8. With the official files in data/ (train-v2.0.json, dev-v2.0.json): bash scripts/gpu_squad.sh;
# the official test set is hidden, so only dev is predicted unless data/test-v2.0.json (questions of your own) exists.
# Extra flags are passed on. Output: runs/gpu_squad/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_squad}
squad_flags SQUAD "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" --tasks qa --first_stages "qa*2" --lr 3e-5 \
    --output_dir "$RUNS_DIR/$NAME" "${SQUAD[@]}" "$@"
