#!/usr/bin/env bash
# CPU protocol, the best single model measured (RESULTS.md, "The best recipe"): what helped on minilm-l6, combined.
#   per-task LoRA (rank 8 on query and value, lr 1e-3) over a frozen encoder: nothing is forgotten (0.746 vs 0.734 annealed)
#   QQP cross-encoded (+0.022 QQP accuracy alone), SST with the ordinal cross entropy (+0.006 SST accuracy alone)
#   the thesis' sequential QQP -> [STS, SST, QQP 3%] x 2; STS stays SBERT (a cosine of two encodings: joint encoding lost)
# Extra flags are passed on. Output: runs/cpu_best/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
NAME=${RUN_NAME:-cpu_best}
$LAUNCH multitask_classifier.py "${CPU_FLAGS[@]}" --option pretrain --adapter lora --lr 1e-3 --cycles 2 \
    --pair_encoder qqp:cross --sst_objective ordinal \
    --output_dir "runs/$NAME" $(prediction_flags "$NAME") "$@"
