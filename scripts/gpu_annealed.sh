#!/usr/bin/env bash
# Annealed-sampling multi-task training (p_i ~ N_i^alpha), 5 epochs
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/gpu_annealed/
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
python multitask_classifier.py "${GPU_FLAGS[@]}" --schedule annealed --epochs 5 --output_dir runs/gpu_annealed $(prediction_flags gpu_annealed) "$@"
