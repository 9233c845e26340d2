#!/usr/bin/env bash
# CPU protocol, the thesis' sequential SBERT-only run (tables 4.3-4.6) as scripts/gpu_thesis_sbert.sh sets it, on
# minilm-l6 at max_length 64 (CPU_FLAGS; the thesis: bert-base-uncased, 512) with the epochs scaled down: QQP 1,
# STS 3, SST 3 (the thesis: 3 / 10 / 10), each task's block going on from its best dev epoch. Its other settings are
# the thesis': no SMART, batch 32, dropout 0.3, lr 1e-5, float32, STS 2.5 cos + 2.5 with dropout before the cosine.
# Extra flags are passed on (e.g. --max_train_examples 2000). Output: runs/cpu_thesis_sbert/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_thesis_sbert}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${THESIS_FLAGS[@]}" --batch_size 32 --hidden_dropout_prob 0.3 \
    --first_stages "qqp,sts*3,sst*3" --cycles 0 --stage_start best \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
