#!/usr/bin/env bash
# CPU protocol, the thesis' best model SMART-SBERT (table 4.10; with --no-smart table 4.11) as
# scripts/gpu_thesis_ss_cycles.sh sets it, on minilm-l6 at max_length 64 (CPU_FLAGS; the thesis: bert-base-uncased,
# 512) with the cycles scaled down: QQP, then [STS, SST, QQP 3%] x 3 (the thesis: x 10), keeping the model with the
# best overall dev score. Its other settings are the thesis': batch 8, dropout 0.1, lr 1e-5, float32, STS
# 2.5 cos + 2.5 with dropout before the cosine, SMART as its listings A.1-A.4 (THESIS_SMART_FLAGS).
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1, --no-smart). Output: runs/cpu_thesis_ss_cycles/
# (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_thesis_ss_cycles}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${THESIS_SMART_FLAGS[@]}" "${THESIS_FLAGS[@]}" --batch_size 8 \
    --hidden_dropout_prob 0.1 --first_stages qqp --cycle "sts,sst,qqp:0.03" --cycles 3 \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
