#!/usr/bin/env bash
# Annealed-sampling multi-task training (p_i ~ N_i^alpha), 5 epochs
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/gpu_annealed/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_annealed}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" --schedule annealed --epochs 5 --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
