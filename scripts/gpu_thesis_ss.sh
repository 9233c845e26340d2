#!/usr/bin/env bash
# The thesis' sequential SMART-SBERT run, setting by setting (seed 000, section 4.2.2.2, tables 4.7-4.9): QQP, then
# 10 STS epochs, then 10 SST epochs, each task's stages going on from that task's best dev epoch (--stage_start best:
# "we fine-tuned the best model from the STS stage on the SST dataset"). QQP_EPOCHS: 1, as table 4.7 (SMART made a
# QQP epoch take 5 hours on its L4); its SBERT-only run (tables 4.3-4.6) trained 3 / 10 / 10.
#  - batch 8 for every task (the thesis: SMART ran out of memory above it), dropout 0.3 before the heads (it moved
#    to 0.1 only after table 4.9), mean pooling, SBERT pairs, float32 (its code has no autocast);
#  - lr 1e-5: the thesis does not state one; its code is the course's, whose default for fine-tuning this is;
#  - STS as 2.5 cos + 2.5 against the label with MSE and dropout on both embeddings before the cosine (listing A.6);
#  - SMART as listings A.1-A.4: lambda_s 5 (10 for SST), mu 1, sigma = eps = 1e-5, eta 1e-3, one ascent step, the
#    gradient normalised and the perturbation rescaled to inf-norm eps per example (--smart_norm_level sentence
#    --smart_projection rescale); momentum 0.99 -> 0.999 after 10% of each epoch, and D_Breg anchored to the weights
#    the epoch started from (the thesis' code never loads its moving average).
# Extra flags are passed on (e.g. --max_train_examples 2000, --precision auto). Output: runs/gpu_thesis_ss/
# (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_thesis_ss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${SMART_FLAGS[@]}" "${THESIS_FLAGS[@]}" --hidden_dropout_prob 0.3 \
    --first_stages "qqp*${QQP_EPOCHS:-1},sts*10,sst*10" --cycles 0 --stage_start best \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
