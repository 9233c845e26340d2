#!/usr/bin/env bash
# CPU protocol, the robustness study (issue 47): does SMART make minBERT more robust? The suite
# (scripts/robustness.py) on the kept models of the forgetting study's runs (cpu_forgetting_study.sh
# --max_train_examples 2000: minilm-l6, QQP -> STS x 2 -> SST x 2), one run a seed of each arm in ARMS (default
# "none smart lnsr ensemble", the first the baseline), each arm's runs named as the forgetting study's seeds are:
#   none      no regulariser                 none, none_seed1, ..., none_seed4
#   smart     the thesis' SMART (R_s on)     thesis_smart, thesis_smart_seed1, ..., thesis_smart_seed4
#   lnsr      LNSR on every task             lnsr, lnsr_seed1, ..., lnsr_seed4
#   ensemble  none_seed2..4's ensemble (their mean probabilities; one ensemble, so no seed spread)
# and the ablation of the thesis' SMART (issue 57; cpu_forgetting_study.sh's arms of the same names, SMART's passes in
# exact float32): thesis_smart_fp32, bregman_epoch (D_Breg alone), rs_only (R_s alone), rs_eps0 (R_s at eps 0: two
# dropout forwards) and thesis_setting (the thesis' own batch, dropout, STS head and float32), e.g.
#   ARMS="none smart thesis_smart_fp32 rs_eps0" SEEDS=11711 bash scripts/cpu_robustness_study.sh
# SEEDS (default "11711 1 2 3 4"): which seeds of each arm, 11711 the run without a _seed suffix. A run named that is
# not in RUNS_DIR stops the study in one line before anything is scored.
# Every run is scored on the same sets, made once in $STUDY_DIR/perturbed by the first run scored (smart's first when
# it is among ARMS, as the committed study was made): 500 dev examples a task,
# each noise (4 character, 3 word kinds) at rate 0.2, the embedding attack at eps 0.01 / 0.03 / 0.1 and the greedy
# attack (budget 50) on the first 100. Then the embedding attack alone at SMART's own training radii, eps 1e-5 / 1e-4
# / 1e-3, on the same 100 examples, in $STUDY_DIR/small_radii/: apart, because each radius' ascent starts from the
# previous one's best perturbation, so adding radii to the first suite would change its 0.01 (and the committed
# scores of the first suite stay comparable). A run already scored is not scored again (its robustness.json), so the
# script continues where it stopped; scripts/compare_robustness.py refuses runs scored on other sets, radii or attack
# settings in one line, so a kept suite cannot be mixed with another silently. Then each comparison: each arm's drops
# and clean scores against the first arm's, with intervals over the examples and the seeds. Output: $STUDY_DIR
# (default runs/robustness_study/), its comparisons in $COMPARISON.md and ${COMPARISON}_small_radii.md (and .json;
# COMPARISON defaults to "comparison": name another for each call that compares other ARMS or SEEDS, so that one
# call's decision is not replaced by the next's).
# PRIMARY (compare_robustness.py's --primary, [ARM:]TASK/FAMILY/VARIANT): the main suite's one primary comparison,
# decided by the exact permutation test over the seeds; every other row is secondary, Holm-corrected. Default
# smart:sts/embedding/eps=0.01 when smart is a later arm (declared after the five-seed results were seen: post hoc),
# else none; PRIMARY= declares none. The ablation's, declared before its runs finished (issue 57):
#   ARMS="rs_eps0 rs_only" PRIMARY=rs_only:sts/embedding/eps=0.01 bash scripts/cpu_robustness_study.sh
# PRIMARY_SMALL_RADII: the same for the small-radii comparison, default none (every comparison there secondary).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
STUDY_DIR=${STUDY_DIR:-$RUNS_DIR/robustness_study}
ARMS=(${ARMS:-none smart lnsr ensemble})
COMPARISON=${COMPARISON:-comparison}
SEEDS=(${SEEDS:-11711 1 2 3 4})
ENSEMBLE=(none_seed2 none_seed3 none_seed4)
declare -A PREFIX=([none]=none [smart]=thesis_smart [lnsr]=lnsr [thesis_smart_fp32]=thesis_smart_fp32
                   [bregman_epoch]=bregman_epoch [rs_only]=rs_only [rs_eps0]=rs_eps0 [thesis_setting]=thesis_setting)
# The first run scored makes the sets (its embeddings pick the word-neighbour noise): smart's first, as the committed
# study was made, whatever ARMS' order.
SCORING_ORDER=(smart none lnsr thesis_smart_fp32 bregman_epoch rs_only rs_eps0 thesis_setting ensemble)
SETS=(--data_dir "$DATA_DIR" --max_examples 500 --rates 0.2 --perturbed_dir "$STUDY_DIR/perturbed")
SUITE=("${SETS[@]}" --epsilons 1e-2 3e-2 1e-1 "$@")
# The small radii score the embedding attack alone, which refuses the flags of the families it does not run (they
# would do nothing): the extra flags of the greedy attack and the word noise go to the main suite only.
EMBEDDING_FLAGS=()
for ((i = 1; i <= $#; i++)); do
    case ${!i} in
        --budget | --regression_margin | --neighbours) i=$((i + 1)) ;;
        --budget=* | --regression_margin=* | --neighbours=*) ;;
        *) EMBEDDING_FLAGS+=("${!i}") ;;
    esac
done
SMALL_RADII=("${SETS[@]}" --families embedding --epsilons 1e-5 1e-4 1e-3 "${EMBEDDING_FLAGS[@]}")
runs_of() {  # runs_of ARM: the arm's runs, one a line
    local arm=$1 seed
    if [[ $arm == ensemble ]]; then printf '%s\n' "${ENSEMBLE[@]}"; return; fi
    for seed in "${SEEDS[@]}"; do
        if [[ $seed == 11711 ]]; then echo "${PREFIX[$arm]}"; else echo "${PREFIX[$arm]}_seed$seed"; fi
    done
}
for arm in "${ARMS[@]}"; do
    if [[ $arm != ensemble && -z ${PREFIX[$arm]:-} ]]; then
        echo "cpu_robustness_study.sh: ARMS: unknown arm '$arm' (use ensemble or ${!PREFIX[*]})" >&2; exit 2
    fi
done
if [[ " ${ARMS[*]:1} " == *" smart "* ]]; then PRIMARY=${PRIMARY-smart:sts/embedding/eps=0.01}; fi
declare -A PRIMARY_OF=([SUITE]=${PRIMARY:-} [SMALL_RADII]=${PRIMARY_SMALL_RADII:-})
for suite in SUITE SMALL_RADII; do  # a primary's arm must be a later arm: known now, before hours of scoring
    primary=${PRIMARY_OF[$suite]}
    if [[ $primary == *:* && " ${ARMS[*]:1} " != *" ${primary%%:*} "* ]]; then
        name=PRIMARY; if [[ $suite == SMALL_RADII ]]; then name=PRIMARY_SMALL_RADII; fi
        echo "cpu_robustness_study.sh: $name: '${primary%%:*}' is not one of the later arms (${ARMS[*]:1})" >&2; exit 2
    fi
done
for arm in "${ARMS[@]}"; do
    for run in $(runs_of "$arm"); do
        if [[ ! -d $RUNS_DIR/$run ]]; then
            echo "cpu_robustness_study.sh: $RUNS_DIR/$run: no such run (arm $arm; SEEDS picks the seeds)" >&2; exit 2
        fi
    done
done
score() {  # score OUTPUT SUITE_NAME RUN...: a suite on one run, or on several runs' ensemble
    local output=$1 suite=$2; shift 2
    local -n flags=$suite
    if [[ ! -f "$output/robustness.json" ]]; then
        python "$ROOT/scripts/robustness.py" "$@" "${flags[@]}" --output_dir "$output"
    fi
}
folders() {  # folders ARM DIR: the arm's folders under DIR, comma-separated (the ensemble's one)
    local arm=$1 dir=$2 runs
    if [[ $arm == ensemble ]]; then echo "$dir/ensemble"; return; fi
    mapfile -t runs < <(runs_of "$arm")
    local IFS=,
    echo "${runs[*]/#/$dir/}"
}
for suite in SUITE SMALL_RADII; do
    dir=$STUDY_DIR
    if [[ $suite == SMALL_RADII ]]; then dir=$STUDY_DIR/small_radii; fi
    for arm in "${SCORING_ORDER[@]}"; do
        if [[ " ${ARMS[*]} " != *" $arm "* ]]; then continue; fi
        if [[ $arm == ensemble ]]; then
            score "$dir/ensemble" "$suite" "${ENSEMBLE[@]/#/$RUNS_DIR/}"
        else
            for run in $(runs_of "$arm"); do score "$dir/$run" "$suite" "$RUNS_DIR/$run"; done
        fi
    done
    comparison=()
    for arm in "${ARMS[@]}"; do comparison+=("$arm=$(folders "$arm" "$dir")"); done
    output=$STUDY_DIR/$COMPARISON.md
    if [[ $suite == SMALL_RADII ]]; then output=$STUDY_DIR/${COMPARISON}_small_radii.md; fi
    primary=()
    if [[ -n ${PRIMARY_OF[$suite]} ]]; then primary=(--primary "${PRIMARY_OF[$suite]}"); fi
    python "$ROOT/scripts/compare_robustness.py" "${comparison[@]}" "${primary[@]}" --output "$output"
done
