#!/usr/bin/env bash
# CPU protocol, the robustness study (issue 47): does SMART make minBERT more robust? The suite
# (scripts/robustness.py) on the kept models of the forgetting study's runs (cpu_forgetting_study.sh
# --max_train_examples 2000: minilm-l6, QQP -> STS x 2 -> SST x 2), five seeds an arm:
#   none      no regulariser                 none, none_seed1, ..., none_seed4
#   smart     the thesis' SMART (R_s on)     thesis_smart, thesis_smart_seed1, ..., thesis_smart_seed4
#   lnsr      LNSR on every task             lnsr, lnsr_seed1, ..., lnsr_seed4
#   ensemble  none_seed2..4's ensemble (their mean probabilities; one ensemble, so no seed spread)
# Every run is scored on the same sets, made once in $STUDY_DIR/perturbed by the first run: 500 dev examples a task,
# each noise (4 character, 3 word kinds) at rate 0.2, the embedding attack at eps 0.01 / 0.03 / 0.1 and the greedy
# attack (budget 50) on the first 100. A run already scored is not scored again (its robustness.json), so the script
# continues where it stopped. Then scripts/compare_robustness.py: each arm's drops and clean scores against none's,
# with intervals over the examples and the seeds. Output: $STUDY_DIR (default runs/robustness_study/), its
# comparison in comparison.md (and .json).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
STUDY_DIR=${STUDY_DIR:-$RUNS_DIR/robustness_study}
NONE=(none none_seed1 none_seed2 none_seed3 none_seed4)
SMART=(thesis_smart thesis_smart_seed1 thesis_smart_seed2 thesis_smart_seed3 thesis_smart_seed4)
LNSR=(lnsr lnsr_seed1 lnsr_seed2 lnsr_seed3 lnsr_seed4)
ENSEMBLE=(none_seed2 none_seed3 none_seed4)
SUITE=(--data_dir "$DATA_DIR" --max_examples 500 --rates 0.2 --epsilons 1e-2 3e-2 1e-1
       --perturbed_dir "$STUDY_DIR/perturbed" "$@")
score() {  # score OUTPUT RUN...: the suite on one run, or on several runs' ensemble
    local output=$1; shift
    if [[ ! -f "$STUDY_DIR/$output/robustness.json" ]]; then
        python "$ROOT/scripts/robustness.py" "$@" "${SUITE[@]}" --output_dir "$STUDY_DIR/$output"
    fi
}
for run in "${SMART[@]}" "${NONE[@]}" "${LNSR[@]}"; do score "$run" "$RUNS_DIR/$run"; done
score ensemble "${ENSEMBLE[@]/#/$RUNS_DIR/}"
arm() {  # arm NAME RUN...: compare_robustness.py's NAME=DIR,DIR,...
    local name=$1; shift
    local IFS=,
    echo "$name=${*/#/$STUDY_DIR/}"
}
python "$ROOT/scripts/compare_robustness.py" "$(arm none "${NONE[@]}")" "$(arm smart "${SMART[@]}")" \
    "$(arm lnsr "${LNSR[@]}")" "ensemble=$STUDY_DIR/ensemble" --output "$STUDY_DIR/comparison.md"
