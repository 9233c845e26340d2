#!/usr/bin/env bash
# CPU protocol, one task of the best recipe (cpu_best.sh) alone: its per-task LoRA and head over the frozen
# encoder, trained on that task's stages of the full schedule (SST: 2 epochs; STS: 2 epochs; QQP: 1 epoch and
# two 3% rehearsals). With BERT frozen and an adapter per task, no other task's stage changes this task's
# scores, so a setting of one task (e.g. --distill_weight) is swept at a fraction of the full run's cost; the
# seed's draws differ from the full run's, so compare runs of this script with each other.
#   TASK=sst SEED=1 RUN_NAME=sst_w1 DATA_DIR=../shared/data/protocol bash scripts/cpu_best_one_task.sh \
#       --distill results/h100_distill/h100_teacher --distill_weight 1
# Extra flags are passed on. Output: runs/cpu_best_$TASK/ (runs/$RUN_NAME/ if set), its two CSVs in predictions/
set -euo pipefail
source "$(dirname "$0")/_common.sh"
TASK=${TASK:?set TASK to sst, qqp or sts}
declare -A STAGES=([sst]='sst*2' [sts]='sts*2' [qqp]='qqp,qqp:0.03,qqp:0.03')
STAGE_LIST=${STAGES[$TASK]:?"TASK: unknown task $TASK (use sst, qqp, sts)"}
NAME=${RUN_NAME:-cpu_best_$TASK}
declare -A PREFIX=([sst]=sst [qqp]=para [sts]=sts)
DIR="$RUNS_DIR/$NAME/predictions"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" "${BEST_FLAGS[@]}" --tasks "$TASK" --first_stages "$STAGE_LIST" \
    --cycles 0 --output_dir "$RUNS_DIR/$NAME" --"${PREFIX[$TASK]}"_dev_out "$DIR/${PREFIX[$TASK]}-dev-out.csv" \
    --"${PREFIX[$TASK]}"_test_out "$DIR/${PREFIX[$TASK]}-test-out.csv" "$@"
