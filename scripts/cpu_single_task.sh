#!/usr/bin/env bash
# CPU protocol, per-task baselines: QQP 1 epoch, STS 3 epochs, SST 3 epochs, each its own model
# Extra flags are passed on (e.g. --max_train_examples 2000). Output: runs/cpu_single_{qqp,sts,sst}/ (runs/${RUN_NAME}_single_*/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
single_task_runs "${RUN_NAME:-cpu}" "${CPU_FLAGS[@]}" "$@"
