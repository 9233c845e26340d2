#!/usr/bin/env bash
# CPU protocol, one model for all four tasks: SST, QQP, STS and SQuAD 2.0 in annealed-sampling epochs (seed 002's
# shared model), 2 epochs; its three-task twin is `bash scripts/cpu_annealed.sh --epochs 2` (what QA costs the others).
#   DATA_DIR=../shared/data/protocol SQUAD_DIR=../shared/data/squad bash scripts/cpu_four_tasks.sh
# Extra flags are passed on. Output: runs/cpu_four_tasks/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_four_tasks}
prediction_flags PREDICTIONS "$NAME"
squad_flags SQUAD "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" --tasks sst,qqp,sts,qa --schedule annealed --epochs 2 \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "${SQUAD[@]}" "$@"
