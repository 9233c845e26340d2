#!/usr/bin/env bash
# CPU protocol, the thesis' SMART-SBERT + SimCSE run (tables 4.12-4.13) as scripts/gpu_thesis_sss.sh sets it, on
# minilm-l6 at max_length 64 (CPU_FLAGS) and the offline NLI files, scaled down: 2 SimCSE epochs going on from the
# best on STS dev (the thesis: 3 on SNLI), then QQP -> [STS, SST, QQP 3%] x 3 (the thesis: x 10). Its other settings
# are the thesis': batch 8, dropout 0.1, lr 1e-5 (SimCSE's too), float32, STS 2.5 cos + 2.5 with dropout before the
# cosine, SMART's listings A.1-A.4.
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_thesis_sss/
# (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_thesis_sss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${SMART_FLAGS[@]}" "${THESIS_FLAGS[@]}" --simcse_lr 1e-5 \
    --simcse_data "${CPU_NLI_FILES[@]}" --simcse_epochs 2 --simcse_keep best --cycles 3 \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
