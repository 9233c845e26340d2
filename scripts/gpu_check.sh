#!/usr/bin/env bash
# One command to verify a CUDA machine, offline (random bert-base config and the bundled minilm-l6), in minutes:
# the course checks, the tests marked gpu, the encoder and SMART benchmarks against transformers, float32 against
# 16-bit autocast, the host syncs, weight casts and graph breaks of one training step (step_audit), the whole step
# captured as CUDA graphs against the eager one (captured_step), and a short
# gpu_ss.sh / gpu_best.sh run on the demo data. Prints one summary table; logs go to runs/gpu_check/.
#   bash scripts/gpu_check.sh                      every check, then the table
#   bash scripts/gpu_check.sh gpu_tests qqp_epoch  only these checks (a failed one after a fix, say), then the table
#                                                  of every check recorded in runs/gpu_check/, the earlier ones too
#   bash scripts/gpu_check.sh --list               the checks' names
set -uo pipefail  # not -e: every check runs and reports, a failing one does not hide the others
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
LOGS="$RUNS_DIR/gpu_check"
CHECKS=(sanity_check optimizer_test gpu_tests
        encoder_bert-base-random smart_bert-base-random precision_bert-base-random step_audit_bert-base-random
        encoder_minilm-l6 smart_minilm-l6 precision_minilm-l6 step_audit_minilm-l6
        encoder_compiled encoder_cuda_graphs encoder_packed captured_step qqp_epoch smart_precision gpu_ss gpu_best)
if [[ "${1:-}" == --list ]]; then printf '%s\n' "${CHECKS[@]}"; exit 0; fi
for name in "$@"; do
    [[ " ${CHECKS[*]} " == *" $name "* ]] || {
        echo "gpu_check: unknown check '$name' (bash scripts/gpu_check.sh --list names them)"; exit 2; }
done
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
    echo "gpu_check: no CUDA device visible to torch"; exit 2; }
# A full run starts afresh; a run of named checks replaces their rows and figures and keeps the others'.
[[ $# -eq 0 ]] && rm -rf "$LOGS"
mkdir -p "$LOGS/rows" "$LOGS/figures"
SELECTED=("${@:-${CHECKS[@]}}")

# check NAME COMMAND...: if NAME is selected, runs it, logs it and records in rows/NAME its pass/fail, seconds and the
# last line it printed. A benchmark's --json @FIGURES@ becomes figures/NAME.jsonl, replaced on each run of NAME.
check() {
    local name=$1 start status last figures
    shift
    [[ " ${SELECTED[*]} " == *" $name "* ]] || return 0
    figures="$LOGS/figures/$name.jsonl"
    rm -f "$figures"
    start=$(date +%s)
    "${@//@FIGURES@/$figures}" >"$LOGS/$name.log" 2>&1
    status=$?
    last=$(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1 | cut -c 1-90)
    echo "| $name | $([ $status -eq 0 ] && echo pass || echo "FAIL ($status)") | $(($(date +%s) - start)) s | $last |" \
        >"$LOGS/rows/$name"
}

# The figures the table quotes, read from the benchmarks' JSON lines (figures/): figure CONFIG/TITLE_PART KEY [SCALE]
# (SCALE 1000: seconds as milliseconds); "n/a" where the benchmark failed or has no such key (an fp16 GPU: no bf16 time).
figure() {
    python - "$LOGS/figures" "$1" "$2" "${3:-1}" "${CHECKS[@]}" <<'EOF'
import json, pathlib, sys
folder, which, key, scale, *checks = sys.argv[1:]
config, title_part = which.split("/")
files = [pathlib.Path(folder, f"{name}.jsonl") for name in checks]  # in the checks' order, as they run
for line in (line for path in files if path.is_file() for line in path.open()):
    result = json.loads(line)
    if result["setup"]["config"] == config and title_part in result["benchmark"]:
        value = result
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            print(round(value * float(scale), 3) if isinstance(value, float) else value)
            sys.exit()
print("n/a")
EOF
}

check sanity_check python sanity_check.py
check optimizer_test python optimizer_test.py
check gpu_tests python -m pytest -q -m gpu -s
for config in bert-base-random minilm-l6; do
    check "encoder_$config" python scripts/benchmark.py encoder --device cuda --config "$config" --seq_len 128 \
        --json @FIGURES@
    check "smart_$config" python scripts/benchmark.py smart --device cuda --config "$config" --seq_len 128 \
        --json @FIGURES@
    # The encoder benchmark times the run's precision only: this one sets float32 (TF32) against 16-bit autocast, and
    # under bf16 against the bf16 step that reads --bf16_weights' copies (no weight casts).
    check "precision_$config" python scripts/benchmark.py precision --device cuda --config "$config" --seq_len 128 \
        --json @FIGURES@
    check "step_audit_$config" python scripts/benchmark.py step_audit --device cuda --config "$config" \
        --seq_len 128 --json @FIGURES@
done
# bert-base-random only: minBERT's layers compiled against transformers eager and compiled, the packed layout
# against the padded grid CUDA runs on, one QQP SMART epoch of the course's 141,506 pairs from 60 timed steps, and
# what exact float32 buys SMART against the run's precision (its table is in the log).
QQP_DATA="$ROOT/../shared/data/protocol"
[ -f "$QQP_DATA/quora-train.csv" ] || QQP_DATA="$ROOT/data/demo"
check encoder_compiled python scripts/benchmark.py encoder --device cuda --config bert-base-random --seq_len 128 \
    --compile --json @FIGURES@
check encoder_cuda_graphs python scripts/benchmark.py encoder --device cuda --config bert-base-random --seq_len 128 \
    --compile --compile_mode reduce-overhead --warmup 5 --json @FIGURES@
check encoder_packed python scripts/benchmark.py encoder --device cuda --config bert-base-random --seq_len 128 \
    --token_layout packed --json @FIGURES@
# The whole training step, plain and SMART (forward, loss and SMART's terms, backward, clipping, AdamW), captured as
# CUDA graphs (--capture_step) against the eager step, bf16 at 32 x 128: whether --capture_step should become the GPU
# recipes' default.
check captured_step python scripts/benchmark.py captured_step --device cuda --config bert-base-random --batch_size 32 \
    --seq_len 128 --precision bf16 --warmup 5 --json @FIGURES@
check qqp_epoch python scripts/benchmark.py qqp_epoch --device cuda --config bert-base-random --seq_len 128 \
    --data_dir "$QQP_DATA" --warmup 10 --steps 60 --rounds 1 --json @FIGURES@
check smart_precision python scripts/smart_precision.py --device cuda --data_dir "$QQP_DATA"
# About 200 optimizer steps each: the demo's 160 training examples per task at batch 8.
DEMO_FLAGS=(--pretrained minilm-l6 --batch_size 8 --cycles 5 --quiet)
check gpu_ss env DATA_DIR="$ROOT/data/demo" RUN_NAME=gpu_check_ss bash scripts/gpu_ss.sh "${DEMO_FLAGS[@]}"
check gpu_best env DATA_DIR="$ROOT/data/demo" RUN_NAME=gpu_check_best bash scripts/gpu_best.sh "${DEMO_FLAGS[@]}"

echo
echo "GPU check on $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)," \
     "torch $(python -c 'import torch; print(torch.__version__)'), $(date -u +%Y-%m-%d)"
echo
echo "| check | result | time | last line of its log ($LOGS/) |"
echo "|---|---|---|---|"
for name in "${CHECKS[@]}"; do [[ -f "$LOGS/rows/$name" ]] && cat "$LOGS/rows/$name"; done
echo
echo "| figure | bert-base-random | minilm-l6 | goal |"
echo "|---|---|---|---|"
echo "| minBERT train step speed-up over transformers (SDPA, 32 x 128) | $(figure bert-base-random/encoder speedup_minbert_vs_transformers) | $(figure minilm-l6/encoder speedup_minbert_vs_transformers) | >= 1.2 |"
echo "| minBERT step model FLOPs utilisation (run's precision) | $(figure bert-base-random/encoder mfu.minbert) | $(figure minilm-l6/encoder mfu.minbert) | |"
echo "| minBERT train step (ms) | $(figure bert-base-random/encoder median_step_s.minbert 1000) | $(figure minilm-l6/encoder median_step_s.minbert 1000) | <= 10 (bert-base, bf16) |"
echo "| minBERT compiled: speed-up over transformers eager / compiled | $(figure "bert-base-random/minBERT compiled" speedup_minbert_vs_transformers) / $(figure "bert-base-random/minBERT compiled" speedup_minbert_vs_transformers_compiled) | | >= 1.5 / >= 1.1 |"
echo "| minBERT compiled train step (ms; MFU) | $(figure "bert-base-random/minBERT compiled" median_step_s.minbert 1000); $(figure "bert-base-random/minBERT compiled" mfu.minbert) | | |"
echo "| minBERT compiled with CUDA graphs (reduce-overhead): train step (ms); speed-up over transformers eager | $(figure "bert-base-random/reduce-overhead" median_step_s.minbert 1000); $(figure "bert-base-random/reduce-overhead" speedup_minbert_vs_transformers) | | <= 10 ms |"
echo "| whole step captured (--capture_step, CUDA graphs; bf16, 32 x 128): eager / captured step (ms); speed-up | $(figure "bert-base-random/captured whole" median_step_s.eager 1000) / $(figure "bert-base-random/captured whole" median_step_s.captured 1000); $(figure "bert-base-random/captured whole" speedup_captured_vs_eager) | | > 1: the GPU recipes' default |"
echo "| SMART step captured the same way: eager / captured step (ms); speed-up; captured SMART / captured plain | $(figure "bert-base-random/captured whole" median_step_s.smart_eager 1000) / $(figure "bert-base-random/captured whole" median_step_s.smart_captured 1000); $(figure "bert-base-random/captured whole" smart_speedup_captured_vs_eager); $(figure "bert-base-random/captured whole" smart_captured_cost_ratio) | | > 1; <= 2.6 |"
echo "| minBERT packed tokens train step (ms; CUDA's default is the padded grid) | $(figure "bert-base-random/tokens packed" median_step_s.minbert 1000) | | |"
echo "| SMART step / plain step | $(figure bert-base-random/SMART smart_cost_ratio) | $(figure minilm-l6/SMART smart_cost_ratio) | <= 2.6 |"
echo "| the same with --smart_precision exact | $(figure bert-base-random/SMART smart_exact_cost_ratio) | $(figure minilm-l6/SMART smart_exact_cost_ratio) | |"
echo "| one QQP SMART epoch, 141,506 pairs at batch 32 (hours; implied on an L4, an estimate) | $(figure bert-base-random/QQP epoch_hours); $(figure bert-base-random/QQP implied_l4_epoch_hours_estimate) | | thesis: 5 on an L4 at batch 8 |"
echo "| the same with transformers | $(figure bert-base-random/SMART transformers_smart_cost_ratio) | $(figure minilm-l6/SMART transformers_smart_cost_ratio) | |"
echo "| peak memory of the SMART step (MiB) | $(figure bert-base-random/SMART peak_step_memory_mib.smart) | $(figure minilm-l6/SMART peak_step_memory_mib.smart) | < 12288 |"
echo "| precision | $(figure bert-base-random/encoder setup.precision) | $(figure minilm-l6/encoder setup.precision) | |"
for kind in float32 bf16_autocast; do
    echo "| minBERT train step, $kind (ms; precision) | $(figure "bert-base-random/float32 vs" median_step_s.$kind 1000) | $(figure "minilm-l6/float32 vs" median_step_s.$kind 1000) | |"
done
echo "| 16-bit autocast step speed-up over float32 (TF32) | $(figure "bert-base-random/float32 vs" speedup_16bit_vs_float32) | $(figure "minilm-l6/float32 vs" speedup_16bit_vs_float32) | >= 1.3 |"
echo "| bf16 step reading --bf16_weights' copies (ms); speed-up over autocast's casts | $(figure "bert-base-random/float32 vs" median_step_s.bf16_weights 1000); $(figure "bert-base-random/float32 vs" speedup_bf16_weights_vs_casts) | $(figure "minilm-l6/float32 vs" median_step_s.bf16_weights 1000); $(figure "minilm-l6/float32 vs" speedup_bf16_weights_vs_casts) | > 1 |"
# views: operators that make no kernel on a GPU; weight casts: the bf16 casts of the weights (bf16 autocast only)
for key in host_syncs ops views weight_casts graph_breaks graph_breaks_forward_and_loss graph_breaks_whole_step; do
    case $key in ops|views|weight_casts) goal= ;; *) goal=0 ;; esac
    echo "| plain step $key (step_audit) | $(figure bert-base-random/step_audit plain_step.$key) | $(figure minilm-l6/step_audit plain_step.$key) | $goal |"
done
for key in host_syncs ops views weight_casts; do
    case $key in host_syncs|weight_casts) goal=0 ;; *) goal= ;; esac
    echo "| plain step with --bf16_weights $key (step_audit; bf16 only) | $(figure bert-base-random/step_audit plain_step_bf16_weights.$key) | $(figure minilm-l6/step_audit plain_step_bf16_weights.$key) | $goal |"
done
for key in host_syncs ops views weight_casts graph_breaks_whole_step; do
    echo "| SMART step $key (step_audit) | $(figure bert-base-random/step_audit smart_step.$key) | $(figure minilm-l6/step_audit smart_step.$key) | $(case $key in host_syncs) echo '<= 1' ;; graph_breaks_whole_step) echo 0 ;; esac) |"
done
! cat "$LOGS"/rows/* 2>/dev/null | grep -q FAIL
