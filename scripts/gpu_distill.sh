#!/usr/bin/env bash
# GPU twin of cpu_distill.sh on bert-base-uncased: gpu_best.sh's recipe trained on gold labels mixed with the
# train scores of TEACHER (an scripts/ensemble.py --score_train output, or a run written with --score_train).
#   TEACHER=runs/teacher bash scripts/gpu_distill.sh
# Extra flags are passed on (--distill_weight, --distill_temperature). Output: runs/gpu_distill/ (runs/$RUN_NAME/)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_distill}
: "${TEACHER:?set TEACHER to a folder with scores/TASK-train.csv (see the header of scripts/cpu_distill.sh)}"
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${BEST_FLAGS[@]}" --distill "$TEACHER" \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
