#!/usr/bin/env bash
# One bert-base model for all four tasks on a GPU: SST, QQP, STS and SQuAD 2.0 in annealed-sampling epochs (seed 002's
# shared model), 5 epochs like gpu_annealed.sh, its three-task twin. SQuAD's official files in SQUAD_DIR (default data/).
# Extra flags are passed on. Output: runs/gpu_four_tasks/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_four_tasks}
prediction_flags PREDICTIONS "$NAME"
squad_flags SQUAD "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" --tasks sst,qqp,sts,qa --schedule annealed --epochs 5 \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "${SQUAD[@]}" "$@"
