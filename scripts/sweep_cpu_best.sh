#!/usr/bin/env bash
# CPU protocol, issue 48's study: cpu_best.sh's settings searched by scripts/sweep.py (Optuna's TPE sampler, the
# median pruner on each stage's overall dev score). The space, scripts/sweep_spaces/cpu_best.json: lr 3e-4..3e-3
# (log), LoRA rank 8 / 16 / 32 and alpha 8 / 16 / 32, LoRA dropout 0..0.2, hidden dropout 0..0.3, 1-3 cycles,
# constant or linear schedule, SMART off or on (lambda_s 1..20, mu 0.1..3, log). The recipe's own settings
# (cpu_best.sh: lr 1e-3, rank 16, alpha 16, 2 cycles, constant, no SMART, dropouts 0.1 and 0) are queued as the first
# trial, so the sweep measures them under its own budget. Budget: TRIALS (default 20, the whole sweep, all workers
# together), TIMEOUT seconds after which a worker begins no new trial (default 10800), STARTUP_TRIALS the median
# pruner lets finish before it prunes (default 5; a small budget wants fewer), WARMUP_STAGES the stages it never
# stops a trial at (default 2: QQP and STS, so that a trial is first judged once it has trained every task), each
# trial on MAX_TRAIN_EXAMPLES of each train set (default 4000; the dev sets whole, which costs most of a trial:
# QQP's 20,000 cross-encoded pairs after every stage). Run it again to continue (runs/sweeps/STUDY.db). On 2 cores,
# run the same command in a second shell as a second worker, each with OMP_NUM_THREADS=1 (docs/sweeps.md). A winner
# must then beat cpu_best.sh over seeds at full size:
#   SEED=S RUN_NAME=... bash scripts/cpu_best.sh <the winner's flags>   and scripts/compare_runs.py (docs/sweeps.md)
# Extra flags go to sweep.py's base run. Output: runs/sweeps/$STUDY/ (STUDY default cpu_best), summary.md there.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
STUDY=${STUDY:-cpu_best}
SPACE="$ROOT/scripts/sweep_spaces/cpu_best.json"
SWEEP=(--study "$STUDY" --space "$SPACE" --trials "${TRIALS:-20}" --timeout "${TIMEOUT:-10800}"
       --sweeps_dir "$RUNS_DIR/sweeps" --pruner median --startup_trials "${STARTUP_TRIALS:-5}"
       --warmup_stages "${WARMUP_STAGES:-2}")
BASE=("${CPU_FLAGS[@]}" "${BEST_FLAGS[@]}" --max_train_examples "${MAX_TRAIN_EXAMPLES:-4000}" "$@")
python "$ROOT/scripts/sweep.py" "${SWEEP[@]}" --enqueue "$ROOT/scripts/sweep_spaces/cpu_best_recipe.json" \
    -- "${BASE[@]}"
