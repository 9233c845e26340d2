#!/usr/bin/env bash
# CPU protocol, SMART-SBERT + SimCSE (SSS) on the offline NLI files: one SimCSE epoch (the thesis' table 4.13: three
# on SNLI, going on from the best), then the schedule of scripts/cpu_ss.sh, with its departures from the thesis
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_sss/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_sss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${SMART_FLAGS[@]}" --simcse_data "${CPU_NLI_FILES[@]}" --cycles 3 --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
