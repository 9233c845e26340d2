#!/usr/bin/env bash
# CPU protocol, SBERT only: minilm-l6, QQP -> [STS, SST, QQP 3%] x 3 (the thesis' table 4.11 runs 10 cycles of
# bert-base); lr 5e-5, batch 32 and the STS objective depart from the thesis as scripts/gpu_sbert.sh says
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_sbert/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_sbert}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" --cycles 3 --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
