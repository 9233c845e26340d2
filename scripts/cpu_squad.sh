#!/usr/bin/env bash
# CPU protocol, SQuAD 2.0 alone: minilm-l6 fine-tuned on the span task for 2 epochs (batch 16, lr 5e-5), windows of
# 384 tokens sharing 128 with the one before; the no-answer threshold is chosen on dev after every epoch.
#   DATA_DIR=../shared/data/protocol SQUAD_DIR=../shared/data/squad bash scripts/cpu_squad.sh
# Extra flags are passed on, e.g. QA LoRA over the frozen encoder:
#   RUN_NAME=cpu_squad_lora bash scripts/cpu_squad.sh --option pretrain --adapter lora --lr 1e-3
# Output: runs/cpu_squad/ (runs/$RUN_NAME/ if set), its predictions JSONs in runs/NAME/predictions/
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-cpu_squad}
squad_flags SQUAD "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${CPU_FLAGS[@]}" --tasks qa --first_stages "qa*2" --batch_size 16 \
    --output_dir "$RUNS_DIR/$NAME" "${SQUAD[@]}" "$@"
