#!/usr/bin/env bash
# CPU protocol, the forgetting study (issue 40): the thesis' sequential order QQP -> STS x 2 -> SST x 2 (each task's
# block going on from its best dev epoch, --stage_start best), SBERT heads, minilm-l6 (CPU_FLAGS), with one defence
# against forgetting, named by DEFENCE:
#   none        nothing
#   rehearsal   a 3% QQP stage after the SST block (the project's cycles' rehearsal)
#   bregman     SMART's Bregman proximal point alone (mu 1, no adversarial term, the run-long moving-average anchor;
#               --smart_bregman_weight MU after)
#   thesis_smart  the thesis' own SMART (THESIS_SMART_FLAGS: R_s on at lambda_s 5, SST 10, mu 1, as listings A.1-A.4
#               compute it, D_Breg anchored to the weights each epoch starts from)
#   simcse      the thesis' supervised SimCSE before the schedule (THESIS_SIMCSE_FLAGS), scaled as the tasks are: one
#               epoch over 2,000 triplets of the offline NLI files (CPU_NLI_FILES; the thesis: 3 over SNLI), the
#               encoder going on from the end of it; no defence in the schedule itself
#   lnsr        LNSR on every task (AllBERT's constants: lambda 0.005, sigma^2 1e-5, noise at layer L - 2): a
#               smoothness regulariser rather than a defence, the robustness study's third arm (issue 47)
#   ewc         EWC, lambda EWC_WEIGHT (default 1e6), the diagonal Fisher of each finished block's first 100 batches
#   l2sp        L2-SP, alpha L2SP_WEIGHT (default 0.01), towards the pretrained weights
#   lora        per-task LoRA (rank 16, every linear layer) over the frozen encoder: no forgetting by construction
# The epochs are scaled down from the thesis' 1 / 10 / 10 to 1 / 2 / 2 for the CPU. Bregman's mu 1 and EWC's lambda
# 1e6 scored the best final overall dev of mu 0.3 / 1 / 3 and lambda 1e3 / 1e5 / 1e6 / 1e7 (RESULTS.md, the
# forgetting study); L2-SP's alpha is an untuned single setting. Extra flags are passed on (e.g.
# --max_train_examples 2000).
# Output: runs/forgetting_$DEFENCE/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
DEFENCE=${DEFENCE:-none}
STAGES="qqp,sts*2,sst*2"
case "$DEFENCE" in
    none) FLAGS=() ;;
    rehearsal) STAGES="$STAGES,qqp:0.03"; FLAGS=() ;;
    bregman) FLAGS=(--smart --smart_adv_weight 0 --smart_bregman_weight 1) ;;
    thesis_smart) FLAGS=("${THESIS_SMART_FLAGS[@]}") ;;
    simcse) FLAGS=("${THESIS_SIMCSE_FLAGS[@]}" --simcse_data "${CPU_NLI_FILES[@]}" --simcse_epochs 1
                   --simcse_max_examples 2000) ;;
    lnsr) FLAGS=(--lnsr --lnsr_tasks sst,qqp,sts) ;;
    ewc) FLAGS=(--ewc_weight "${EWC_WEIGHT:-1000000}") ;;
    l2sp) FLAGS=(--l2sp_weight "${L2SP_WEIGHT:-0.01}") ;;
    lora) FLAGS=(--option pretrain --adapter lora --lr 1e-3 --adapter_rank 16 --adapter_alpha 16
                 --adapter_targets query,key,value,attention_output,ffn_in,ffn_out) ;;
    *) echo "cpu_forgetting_study.sh: DEFENCE must be none, rehearsal, bregman, thesis_smart, simcse, lnsr, ewc, l2sp or lora," \
            "got '$DEFENCE'" >&2
       exit 2 ;;
esac
NAME=${RUN_NAME:-forgetting_$DEFENCE}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" --first_stages "$STAGES" --cycles 0 --stage_start best \
    "${FLAGS[@]}" --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
