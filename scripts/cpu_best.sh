#!/usr/bin/env bash
# CPU protocol, the best single model measured (RESULTS.md, "The best recipe"): one frozen minilm-l6 with per-task
# LoRA of rank 16 (alpha 16) on every linear layer (query, key, value, attention output, both FFN layers), lr 1e-3,
# QQP cross-encoded, SST with the ordinal cross entropy, the thesis' sequential QQP -> [STS, SST, QQP 3%] x 2.
# Nothing is forgotten (each task's adapter apart, BERT frozen). Rank 8 on query and value alone scored lower.
# Extra flags are passed on. Output: runs/cpu_best/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_best}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${BEST_FLAGS[@]}" --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
