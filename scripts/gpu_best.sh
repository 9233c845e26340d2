#!/usr/bin/env bash
# GPU twin of cpu_best.sh on bert-base-uncased: per-task LoRA (rank 16 on every linear layer) over the frozen
# encoder, QQP cross-encoded, SST ordinal, QQP -> [STS, SST, QQP 3%] x 2. Measured on minilm-l6 only: the seeds
# found a frozen bert-base 0.005-0.041 below fine-tuning it, so also try --option finetune --lr 2e-5 (BERT's rate:
# 1e-3 destroys a pretrained BERT). Extra flags are passed on. Output: runs/gpu_best/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_best}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${BEST_FLAGS[@]}" --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
