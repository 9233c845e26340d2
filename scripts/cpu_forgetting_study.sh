#!/usr/bin/env bash
# CPU protocol, the forgetting study (issue 40): the thesis' sequential order QQP -> STS x 2 -> SST x 2 (each task's
# block going on from its best dev epoch, --stage_start best), SBERT heads, minilm-l6 (CPU_FLAGS), with one defence
# against forgetting, named by DEFENCE:
#   none        nothing
#   rehearsal   a 3% QQP stage after the SST block (the project's cycles' rehearsal)
#   bregman     SMART's Bregman proximal point alone (mu 1, no adversarial term, the run-long moving-average anchor;
#               --smart_bregman_weight MU after)
#   thesis_smart  the thesis' own SMART (THESIS_SMART_FLAGS: R_s on at lambda_s 5, SST 10, mu 1, as listings A.1-A.4
#               compute it, D_Breg anchored to the weights each epoch starts from), its passes at the run's bf16
#   simcse      the thesis' supervised SimCSE before the schedule (THESIS_SIMCSE_FLAGS), scaled as the tasks are: one
#               epoch over 2,000 triplets of the offline NLI files (CPU_NLI_FILES; the thesis: 3 over SNLI), the
#               encoder going on from the end of it; no defence in the schedule itself
#   lnsr        LNSR on every task (AllBERT's constants: lambda 0.005, sigma^2 1e-5, noise at layer L - 2): a
#               smoothness regulariser rather than a defence, the robustness study's third arm (issue 47)
#   ewc         EWC, lambda EWC_WEIGHT (default 1e6), the diagonal Fisher of each finished block's first 100 batches
#   l2sp        L2-SP, alpha L2SP_WEIGHT (default 0.01), towards the pretrained weights
#   lora        per-task LoRA (rank 16, every linear layer) over the frozen encoder: no forgetting by construction
# The ablation of the thesis' SMART (issue 57): which of its parts acts? At eps 1e-5 the perturbation is below bf16's
# rounding, so under bf16 lambda_s R_s is a dropout-consistency penalty. These arms run SMART's passes in exact float32
# (--smart_precision exact: the whole loss of a SMART task, its clean forward, the ascent, the perturbed forward and
# the anchor's, computes in float32 without autocast, dropout on; only dev evaluation stays at the run's bf16), so
# that a 1e-5 perturbation is resolved and rs_eps0 separates "adversarial" from "consistency":
#   thesis_smart_fp32  thesis_smart, its passes in exact float32
#   bregman_epoch      its D_Breg alone (lambda_s 0), anchored to each epoch's first weights as the thesis' code does
#   rs_only            its R_s alone (mu 0)
#   rs_eps0            its R_s alone at eps 0: no perturbation, no ascent, the same two forwards under their own
#                      dropout masks (R-Drop's consistency term)
#   thesis_setting     the thesis' own setting scaled to this protocol: thesis_smart with THESIS_FLAGS (float32, lr
#                      1e-5, STS 2.5 cos + 2.5 with dropout before the cosine), batch 8 and dropout 0.3 (the thesis'
#                      sequential run, tables 4.7-4.9; it moved to 0.1 only for its cycles, which this schedule is not)
# Where every arm departs from the thesis (each run's args.json keeps it as "departures"): minilm-l6 at 64 tokens
# (the thesis: bert-base-uncased at 512) and 1 / 2 / 2 epochs (the thesis: 1 / 10 / 10); every arm but
# thesis_setting: batch 32 (8), lr 5e-5 (1e-5), dropout 0.1 (0.3), STS the MSE of the cosine against label / 5
# (2.5 cos + 2.5, dropout before the cosine), bf16 autocast (float32); each arm's own defence where it is not the
# thesis' SMART, and SMART's remaining departures (scripts/_common.sh, THESIS_SMART_FLAGS) wherever it has SMART.
# Bregman's mu 1 and EWC's lambda 1e6 scored the best final overall dev of mu 0.3 / 1 / 3 and lambda 1e3 / 1e5 / 1e6 /
# 1e7 (RESULTS.md, the forgetting study); L2-SP's alpha is an untuned single setting. Extra flags are passed on (e.g.
# --max_train_examples 2000).
# Output: runs/forgetting_$DEFENCE/ (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
DEFENCE=${DEFENCE:-none}
STAGES="qqp,sts*2,sst*2"
SCALED="minilm-l6 at 64 tokens (the thesis: bert-base-uncased, 512); epochs 1 / 2 / 2 (1 / 10 / 10)"
PROTOCOL="$SCALED; batch 32 (8), lr 5e-5 (1e-5), dropout 0.1 (0.3), STS MSE of the cosine against label / 5"
PROTOCOL+=" (2.5 cos + 2.5, dropout before the cosine), bf16 autocast (float32)"
SMART_REST="SMART's other departures as scripts/_common.sh's THESIS_SMART_FLAGS lists them"
EXACT="SMART's passes and the task loss in exact float32, dev evaluation at the run's bf16"
ABLATION=("${THESIS_SMART_FLAGS[@]}" --smart_precision exact)
case "$DEFENCE" in
    none) FLAGS=(); DEPARTS="no SMART" ;;
    rehearsal) STAGES="$STAGES,qqp:0.03"; FLAGS=(); DEPARTS="no SMART; a 3% QQP rehearsal stage" ;;
    bregman) FLAGS=(--smart --smart_adv_weight 0 --smart_bregman_weight 1)
             DEPARTS="D_Breg alone (lambda_s 0; the thesis: 5, SST 10), anchored to the run-long moving average"
             DEPARTS+=" with dropout off (each epoch's first weights, dropout on)" ;;
    thesis_smart) FLAGS=("${THESIS_SMART_FLAGS[@]}"); DEPARTS="$SMART_REST" ;;
    thesis_smart_fp32) FLAGS=("${ABLATION[@]}"); DEPARTS="$EXACT; $SMART_REST" ;;
    bregman_epoch) FLAGS=(--smart --smart_adv_weight 0 --smart_bregman_weight 1 --smart_anchor stage_start
                          --smart_momentum_schedule stage --smart_anchor_mode train --smart_precision exact)
                   DEPARTS="D_Breg alone (lambda_s 0; the thesis: 5, SST 10); $EXACT" ;;
    rs_only) FLAGS=("${ABLATION[@]}" --smart_bregman_weight 0)
             DEPARTS="R_s alone (mu 0; the thesis: 1); $EXACT; $SMART_REST" ;;
    rs_eps0) FLAGS=("${ABLATION[@]}" --smart_bregman_weight 0 --smart_epsilon 0)
             DEPARTS="R_s alone (mu 0; the thesis: 1) at eps 0 (1e-5): two dropout forwards, no perturbation"
             DEPARTS+="; $EXACT; $SMART_REST" ;;
    thesis_setting) FLAGS=("${THESIS_SMART_FLAGS[@]}" "${THESIS_FLAGS[@]}" --batch_size 8 --hidden_dropout_prob 0.3)
                    DEPARTS="lr 1e-5 (the thesis states none: the course's default); $SMART_REST" ;;
    simcse) FLAGS=("${THESIS_SIMCSE_FLAGS[@]}" --simcse_data "${CPU_NLI_FILES[@]}" --simcse_epochs 1
                   --simcse_max_examples 2000)
            DEPARTS="no SMART; SimCSE 1 epoch over 2,000 offline NLI triplets (3 over SNLI)" ;;
    lnsr) FLAGS=(--lnsr --lnsr_tasks sst,qqp,sts); DEPARTS="LNSR on every task instead of SMART" ;;
    ewc) FLAGS=(--ewc_weight "${EWC_WEIGHT:-1000000}"); DEPARTS="no SMART; EWC" ;;
    l2sp) FLAGS=(--l2sp_weight "${L2SP_WEIGHT:-0.01}"); DEPARTS="no SMART; L2-SP" ;;
    lora) FLAGS=(--option pretrain --adapter lora --lr 1e-3 --adapter_rank 16 --adapter_alpha 16
                 --adapter_targets query,key,value,attention_output,ffn_in,ffn_out)
          DEPARTS="no SMART; per-task LoRA over a frozen encoder at lr 1e-3" ;;
    *) echo "cpu_forgetting_study.sh: DEFENCE must be none, rehearsal, bregman, thesis_smart, thesis_smart_fp32," \
            "bregman_epoch, rs_only, rs_eps0, thesis_setting, simcse, lnsr, ewc, l2sp or lora, got '$DEFENCE'" >&2
       exit 2 ;;
esac
if [[ $DEFENCE == thesis_setting ]]; then DEPARTS="$SCALED; $DEPARTS"; else DEPARTS="$PROTOCOL; $DEPARTS"; fi
NAME=${RUN_NAME:-forgetting_$DEFENCE}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" --first_stages "$STAGES" --cycles 0 --stage_start best \
    "${FLAGS[@]}" --departures "$DEPARTS" --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
