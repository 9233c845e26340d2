#!/usr/bin/env bash
# CPU protocol: an ensemble of every reported run whose scores are committed (results/[*/]<run>/scores/), members
# chosen per task by greedy selection on dev (Caruana et al. 2004), SST and QQP by vote, STS by mean. It prints
# the held-out dev figure (chosen on half of dev, scored on the other half), the honest one. No model runs.
# Extra flags are passed on (e.g. --sts weighted). Output: runs/cpu_ensemble/ ($OUTPUT_DIR if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
MEMBERS=()
for scores in results/*/scores results/*/*/scores; do
    # runs of the three tasks (a SQuAD-only run's scores hold no SST, QQP or STS)
    if [[ -f "$scores/sst-dev.csv" ]]; then MEMBERS+=("$(dirname "$scores")"); fi
done
python scripts/ensemble.py "${MEMBERS[@]}" --select \
    --output_dir "${OUTPUT_DIR:-$RUNS_DIR/cpu_ensemble}" --data_dir "$DATA_DIR" "$@"
