#!/usr/bin/env bash
# Per-task fine-tuned baselines on a GPU: QQP 1 epoch, STS 3 epochs, SST 3 epochs, each its own model
# Extra flags are passed on (e.g. --max_train_examples 2000). Output: runs/gpu_single_{qqp,sts,sst}/
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
for stages in 'qqp' 'sts*3' 'sst*3'; do
    python multitask_classifier.py "${GPU_FLAGS[@]}" --first_stages "$stages" --cycles 0 \
        --output_dir "runs/gpu_single_${stages%%\**}" $(prediction_flags "gpu_single_${stages%%\**}") "$@"
done
