#!/usr/bin/env bash
# CPU protocol, one model that carries an ensemble's gain: the best recipe (cpu_best.sh) trained on its gold
# labels mixed with a teacher's scores of the training examples (--distill, distillation.py; w = 0.5, T = 1 unless
# given). TEACHER is a folder with scores/{sst,qqp,sts}-train.csv:
#   an ensemble: its members run with --score_train, then `python scripts/ensemble.py MEMBERS... --select --score_train
#     --output_dir runs/teacher --data_dir "$DATA_DIR"`;
#   one run written with --score_train: self-distillation, the control that separates the ensemble's knowledge
#     from the effect of soft labels.
#   TEACHER=runs/teacher DATA_DIR=../shared/data/protocol bash scripts/cpu_distill.sh
# A task may have its own weight or teacher: --distill_override sst:weight=1 --distill_override
# qqp:teacher=results/cpu_distill/cpu_qqp_teacher (an ensemble of QQP specialists; RESULTS.md, "Distillation").
# Extra flags are passed on (e.g. --distill_weight 0.7 --distill_temperature 2). Output: runs/cpu_distill/
# (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_distill}
: "${TEACHER:?set TEACHER to a folder with scores/TASK-train.csv (see the header of scripts/cpu_distill.sh)}"
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${BEST_FLAGS[@]}" --distill "$TEACHER" \
    --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
