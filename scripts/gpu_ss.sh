#!/usr/bin/env bash
# SMART-SBERT (SS), sequential QQP -> [STS, SST, QQP 3%] x 10 (thesis table 4.10)
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/gpu_ss/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
NAME=${RUN_NAME:-gpu_ss}
$LAUNCH multitask_classifier.py "${GPU_FLAGS[@]}" "${SMART_FLAGS[@]}" --output_dir "$RUNS_DIR/$NAME" $(prediction_flags "$NAME") "$@"
