#!/usr/bin/env bash
# The thesis' SMART-SBERT + SimCSE run, setting by setting (seed 000, section 4.2.2.3, tables 4.12-4.13): 3 epochs
# of supervised SimCSE on SNLI going on from the one with the best STS dev Pearson (--simcse_keep best; listing B.3,
# at the tasks' learning rate), then figure 4.10's schedule, QQP -> [STS, SST, QQP 3%] x 10 keeping the model with
# the best overall dev score, at dropout 0.1 (which it moved to after table 4.9). NLI_FILES: the NLI files (the
# thesis used SNLI). Every other setting as scripts/gpu_thesis_ss.sh: batch 8, lr 1e-5, float32, STS as
# 2.5 cos + 2.5 with dropout before the cosine, and SMART's listings A.1-A.4.
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/gpu_thesis_sss/
# (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_thesis_sss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${SMART_FLAGS[@]}" "${THESIS_FLAGS[@]}" --simcse_lr 1e-5 \
    --simcse_data ${NLI_FILES:?set NLI_FILES to NLI files} --simcse_epochs 3 --simcse_keep best \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
