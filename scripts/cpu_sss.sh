#!/usr/bin/env bash
# CPU protocol, SMART-SBERT + SimCSE (SSS) on the offline NLI files
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_sss/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
NAME=${RUN_NAME:-cpu_sss}
NLI=${NLI_DIR:-$ROOT/../shared/data/nli}; python multitask_classifier.py "${CPU_FLAGS[@]}" "${SMART_FLAGS[@]}" --simcse_data "$NLI/generative_nli/snli/dev.jsonl" "$NLI/snli_senteval/s1.test" "$NLI/generative_nli/mnli/dev.jsonl" "$NLI/generative_nli/anli/test.jsonl" "$NLI/sick/SICK.txt" --cycles 3 --output_dir "runs/$NAME" $(prediction_flags "$NAME") "$@"
