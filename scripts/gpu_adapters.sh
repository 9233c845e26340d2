#!/usr/bin/env bash
# Parameter-efficient: per-task adapters over a frozen bert-base-uncased, QQP -> [STS, SST, QQP 3%] x 10
# ADAPTER=lora|dora|pals (default dora; rank 8, alpha 8 on query and value), lr 1e-3 (AllBERT's for DoRA).
# Extra flags are passed on. To train BERT too, give its rate with it: --option finetune --lr 2e-5 (1e-3
# destroys a pretrained BERT). Output: runs/gpu_$ADAPTER/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
ADAPTER=${ADAPTER:-dora}
NAME=${RUN_NAME:-gpu_$ADAPTER}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" --option pretrain --adapter "$ADAPTER" --lr 1e-3 \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
