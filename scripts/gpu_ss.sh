#!/usr/bin/env bash
# SMART-SBERT (SS): the schedule of the thesis' table 4.10, QQP -> [STS, SST, QQP 3%] x 10 keeping the model with
# the best overall dev score, SMART's lambda_s 5 (10 for SST) and mu 1, dropout 0.1. Where it departs from the thesis:
#  - batch 32: the thesis ran batch 8 because SMART ran out of memory above it on its L4; batch 32 fits one
#    (BENCHMARKS.md, "Memory of a bert-base training step"). lr 2e-5: the thesis does not state its learning rate.
#  - STS is trained by --similarity_objective cosine, MSE(cos, label / 5), which measured better (RESULTS.md, "STS
#    training objective"); the thesis' 2.5 cos + 2.5 is --similarity_objective shifted, without the dropout the
#    thesis applies to the two sentence embeddings before their cosine.
#  - SMART (smart.py) clamps every coordinate of the perturbation to [-eps, eps] after a step normalised per token,
#    where the thesis' listing A.4 rescales each example's perturbation to inf-norm eps; its Bregman momentum
#    (0.99, then 0.999 after 10% of the updates) runs over the whole run, where the thesis' code restarts it every
#    epoch and anchors the Bregman term to the weights the epoch started from.
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/gpu_ss/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_ss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${SMART_FLAGS[@]}" --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
