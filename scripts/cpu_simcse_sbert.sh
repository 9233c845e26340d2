#!/usr/bin/env bash
# CPU protocol, SimCSE on the offline NLI files, then the SBERT-only schedule (no SMART)
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_simcse_sbert/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_simcse_sbert}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" --simcse_data "${CPU_NLI_FILES[@]}" --cycles 3 --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
