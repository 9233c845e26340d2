#!/usr/bin/env bash
# CPU protocol, SMART-SBERT (SS): minilm-l6, QQP -> [STS, SST, QQP 3%] x 3 (the thesis' table 4.10 runs 10 cycles of
# bert-base at batch 8); lr 5e-5, batch 32 and the STS objective depart from the thesis as scripts/gpu_ss.sh says
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_ss/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_ss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${SMART_FLAGS[@]}" --cycles 3 --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
