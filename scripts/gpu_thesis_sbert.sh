#!/usr/bin/env bash
# The thesis' sequential SBERT-only run, setting by setting (seed 000, section 4.2.2.1, tables 4.3-4.6): the pretrained
# model's dev scores (table 4.3: the run's first record, stage "pretrained"), then 3 QQP epochs (table 4.4), 10 STS
# epochs (4.5) and 10 SST epochs (4.6), each task's block going on from that task's best dev epoch (--stage_start best:
# "we fine-tuned the best-performing model for 10 epochs on the STS task"). Every setting:
#  - no SMART; batch 32, which the thesis does not state for these tables: its batch before SMART forced 8 on it
#    (section 4.2, "Initially, we adopted batch_size=32"); dropout 0.3 before the heads (it moved to 0.1 only after
#    table 4.9);
#  - bert-base-uncased, mean pooling, SBERT pairs: QQP a sigmoid of W [u, v, |u - v|] with binary cross entropy, STS
#    2.5 cos + 2.5 with MSE and dropout on both embeddings before the cosine (listing A.6), SST cross entropy;
#  - AdamW at lr 1e-5 (not stated by the thesis: the course's fine-tuning default), constant, no clipping, float32
#    (its code has no autocast), texts cut at 512 tokens (its tokenizer's limit): THESIS_FLAGS.
# Where it still departs: the seed and the data order are the project's; the thesis reports one run.
# Extra flags are passed on (e.g. --max_train_examples 2000). Output: runs/gpu_thesis_sbert/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_thesis_sbert}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${THESIS_FLAGS[@]}" --max_length 512 --batch_size 32 \
    --hidden_dropout_prob 0.3 --first_stages "qqp*3,sts*10,sst*10" --cycles 0 --stage_start best \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
