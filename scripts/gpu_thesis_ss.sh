#!/usr/bin/env bash
# The thesis' sequential SMART-SBERT run, setting by setting (seed 000, section 4.2.2.2, tables 4.7-4.9): QQP, then
# 10 STS epochs, then 10 SST epochs, each task's block going on from that task's best dev epoch (--stage_start best:
# "we fine-tuned the best model from the STS stage on the SST dataset"). QQP_EPOCHS: 1, as table 4.7 (SMART made a
# QQP epoch take 5 hours on its L4). Every setting:
#  - batch 8 for every task (the thesis: SMART ran out of memory above it), dropout 0.3 before the heads (it moved
#    to 0.1 only after table 4.9);
#  - bert-base-uncased, mean pooling, SBERT pairs: QQP a sigmoid of W [u, v, |u - v|] with binary cross entropy, STS
#    2.5 cos + 2.5 with MSE and dropout on both embeddings before the cosine (listing A.6), SST cross entropy;
#  - AdamW at lr 1e-5 (not stated by the thesis: the course's fine-tuning default), constant, no clipping, float32
#    (its code has no autocast), texts cut at 512 tokens (its tokenizer's limit): THESIS_FLAGS;
#  - SMART as listings A.1-A.4 (THESIS_SMART_FLAGS): lambda_s 5 (10 for SST), mu 1, sigma = eps = 1e-5, eta 1e-3,
#    one ascent step normalised per example, the perturbation rescaled to inf-norm eps per example, R_s the batch
#    mean of each example's largest class term, the anchor's forward with dropout on, the momentum's
#    0.99 -> 0.999 switch after 10% of each epoch, D_Breg anchored to the weights the epoch started from.
# Where it still departs: scripts/_common.sh's THESIS_SMART_FLAGS lists what SMART does not copy (the ascent's own
# clean forward, the KL's 1e-8, listing A.3's unlisted QQP loss); the seed and data order are the project's.
# Extra flags are passed on (e.g. --max_train_examples 2000, --no-smart for the SBERT-only control at these settings).
# Output: runs/gpu_thesis_ss/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_thesis_ss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${THESIS_SMART_FLAGS[@]}" "${THESIS_FLAGS[@]}" \
    --max_length 512 --batch_size 8 --hidden_dropout_prob 0.3 \
    --first_stages "qqp*${QQP_EPOCHS:-1},sts*10,sst*10" --cycles 0 --stage_start best \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
