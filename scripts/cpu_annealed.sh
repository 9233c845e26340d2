#!/usr/bin/env bash
# CPU protocol, annealed-sampling multi-task training, 3 epochs
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_annealed/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_annealed}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" --schedule annealed --epochs 3 --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
