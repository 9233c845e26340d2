#!/usr/bin/env bash
# CPU protocol: an ensemble of every reported run whose scores are committed (results/[*/]<run>/scores/), members
# chosen per task by greedy selection on dev (Caruana et al. 2004), SST and QQP by vote, STS by mean. It prints
# the held-out dev figure (chosen on half of dev, scored on the other half), the honest one. No model runs.
# Extra flags are passed on (e.g. --sts weighted). Output: runs/cpu_ensemble/ ($OUTPUT_DIR if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
MEMBERS=()
for scores in "$ROOT"/results/*/scores "$ROOT"/results/*/*/scores; do
    # runs of the three tasks (a SQuAD-only run's scores hold no SST, QQP or STS)
    if [[ -f "$scores/sst-dev.csv" ]]; then MEMBERS+=("$(dirname "$scores")"); fi
done
# Named from the folder the recipe runs in, as a user would type them (ensemble.json records them): results/NAME from
# the repository, as before, with no machine's absolute path.
mapfile -t MEMBERS < <(python -c 'import os, sys; print(*map(os.path.relpath, sys.argv[1:]), sep="\n")' "${MEMBERS[@]}")
python "$ROOT/scripts/ensemble.py" "${MEMBERS[@]}" --select \
    --output_dir "${OUTPUT_DIR:-$RUNS_DIR/cpu_ensemble}" --data_dir "$DATA_DIR" "$@"
