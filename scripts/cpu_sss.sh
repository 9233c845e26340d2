#!/usr/bin/env bash
# CPU protocol, SMART-SBERT + SimCSE (SSS) on the offline NLI files
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/cpu_sss/
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
NLI=${NLI_DIR:-$ROOT/../shared/data/nli}; python multitask_classifier.py "${CPU_FLAGS[@]}" "${SMART_FLAGS[@]}" --simcse_data "$NLI/generative_nli/snli/dev.jsonl" "$NLI/snli_senteval/s1.test" "$NLI/generative_nli/mnli/dev.jsonl" "$NLI/generative_nli/anli/test.jsonl" "$NLI/sick/SICK.txt" --cycles 3 --output_dir runs/cpu_sss $(prediction_flags cpu_sss) "$@"
