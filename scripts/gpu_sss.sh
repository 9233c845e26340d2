#!/usr/bin/env bash
# SMART-SBERT + SimCSE (SSS): 3 epochs of supervised SimCSE on NLI, then the SS schedule (the thesis' table 4.13).
# NLI_FILES: NLI paths (the thesis used SNLI). It departs from the thesis where scripts/gpu_ss.sh does (batch 32,
# lr 2e-5, the STS objective, SMART as the SMART paper writes it, 128 tokens), and in SimCSE: Gao et al.'s supervised
# loss with in-batch negatives, each premise's i-th entailment with its i-th contradiction, the schedule going on from
# the last SimCSE epoch, where the thesis scores each triplet alone in a two-way softmax (--simcse_objective
# pairwise), pairs every entailment of a premise with every contradiction (--simcse_pairing product) and goes on
# from the epoch with the best STS dev Pearson (--simcse_keep best): scripts/gpu_thesis_sss.sh sets all of them.
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/gpu_sss/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_sss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${SMART_FLAGS[@]}" --simcse_data ${NLI_FILES:?set NLI_FILES to NLI files} --simcse_epochs 3 --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
