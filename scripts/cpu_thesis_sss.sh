#!/usr/bin/env bash
# CPU protocol, the thesis' SMART-SBERT + SimCSE run (tables 4.12-4.13) as scripts/gpu_thesis_sss.sh sets it, on
# minilm-l6 at max_length 64 (CPU_FLAGS; the thesis: bert-base-uncased, 512) and the offline NLI files (the thesis:
# SNLI's training set), scaled down: 2 SimCSE epochs going on from the best on STS dev (the thesis: 3), then
# QQP -> [STS, SST, QQP 3%] x 3 (the thesis: x 10). Its other settings are the thesis': SimCSE's pairwise loss on every
# entailment x contradiction of a premise at lr 1e-5 (THESIS_SIMCSE_FLAGS), batch 8, dropout 0.1, lr 1e-5, float32,
# STS 2.5 cos + 2.5 with dropout before the cosine, SMART as its listings A.1-A.4 (THESIS_SMART_FLAGS).
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_thesis_sss/
# (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_thesis_sss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${THESIS_SMART_FLAGS[@]}" "${THESIS_FLAGS[@]}" \
    "${THESIS_SIMCSE_FLAGS[@]}" --batch_size 8 --hidden_dropout_prob 0.1 --simcse_data "${CPU_NLI_FILES[@]}" \
    --simcse_epochs 2 --simcse_keep best --first_stages qqp --cycle "sts,sst,qqp:0.03" --cycles 3 \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
