#!/usr/bin/env bash
# CPU protocol, parameter-efficient: per-task adapters over a frozen minilm-l6, QQP -> [STS, SST, QQP 3%] x 2
# ADAPTER=lora|dora|pals (default lora; rank 8, alpha 8 on query and value), lr 1e-3 (AllBERT's for DoRA).
# Extra flags are passed on. To train BERT too, give its rate with it: --option finetune --lr 5e-5 (at the
# adapters' 1e-3 a fine-tuned minilm-l6 collapses to the majority class; RESULTS.md). Output: runs/cpu_$ADAPTER/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
ADAPTER=${ADAPTER:-lora}
NAME=${RUN_NAME:-cpu_$ADAPTER}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" --option pretrain --adapter "$ADAPTER" --lr 1e-3 --cycles 2 \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
