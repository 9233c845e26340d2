# Shared by the recipe scripts: where the data lives and how the CPU-sized runs are shaped.
# DATA_DIR: a folder with the course's file names (scripts/download_data.py fills data/).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA_DIR="${DATA_DIR:-$ROOT/data}"
SEED="${SEED:-11711}"  # SEED and RUN_NAME (the folder under runs/) may be set in the environment
# The recipes run in the folder they are started from (they name the repository's files by $ROOT): a relative path
# in their extra flags or in these variables is relative to it, as the user typed it.
# RUNS_DIR: the folder that holds the runs' folders (default the repository's runs/). Each recipe writes runs/NAME/,
# its checkpoints and predictions, as $RUNS_DIR/NAME/; the tests point it at a temporary folder.
RUNS_DIR="${RUNS_DIR:-$ROOT/runs}"
# LAUNCH runs the command line (split into words: a program and its options): python, or torchrun for data parallel
# on several GPUs, e.g.
#   LAUNCH="torchrun --standalone --nproc_per_node 4" bash scripts/gpu_ss.sh   (batch 32 per GPU: 128 per update)
LAUNCH="${LAUNCH:-python}"
# The thesis' SMART weights: lambda_s = 5 for the pair tasks, 10 for SST; mu = 1.
SMART_FLAGS=(--smart --smart_adv_weight 5 --smart_bregman_weight 1 --smart_override sst:adv_weight=10)
# The thesis' own settings (seed 000) for scripts/*_thesis_*.sh, where the project's recipes depart from them (each
# recipe adds its tables' batch size, dropout and schedule): lr 1e-5 (not stated by the thesis: the course's
# fine-tuning default), float32 (its code has no autocast), STS trained as 2.5 cos + 2.5 with dropout on both sentence
# embeddings before the cosine (listing A.6). The GPU recipes add --max_length 512, the limit of the thesis' tokenizer
# (the course's, which pads to the batch's longest text); the CPU twins keep CPU_FLAGS' 64.
THESIS_FLAGS=(--lr 1e-5 --precision fp32 --similarity_objective shifted --sts_cosine_dropout)
# SMART as the thesis' listings A.1-A.4 write it, on SMART_FLAGS' weights: the ascent's step normalised and the
# perturbation rescaled to inf-norm eps over each example (A.4), R_s the batch mean of each example's largest per-class
# term (A.1's torch.max over classes), the anchor's forward with dropout on (A.1's deep copy of the model in train
# mode), the Bregman momentum's 0.99 -> 0.999 switch restarting every epoch, and D_Breg anchored to the weights the
# epoch started from (a variable-name slip means its moving average is never loaded). Where it still departs: the
# listings' ascent compares with the clean outputs of a forward of its own (another dropout mask; here the task
# loss's one clean forward serves the ascent too), they add 1e-8 inside the KL's logarithms, and A.3 trains QQP with
# a paraphrase_simcse_loss the thesis does not list (here binary cross entropy, as its section 3.3.3 says); STS's
# SMART terms compare cosines, the listings' 2.5 cos + 2.5 (STS's terms and its loss all 6.25 times larger there:
# the same ratio between them).
THESIS_SMART_FLAGS=("${SMART_FLAGS[@]}" --smart_norm_level sentence --smart_projection rescale --smart_reduction max
                    --smart_anchor_mode train --smart_momentum_schedule stage --smart_anchor stage_start)
# The thesis' supervised SimCSE (section 3.2.4.3, listings B.1-B.3): each premise against its own entailment and
# contradiction in a two-way softmax (no in-batch negatives; listing B.2 broadcasts its positive term over the batch,
# the formula does not), every entailment of a premise paired with every contradiction of it (B.1's merge on the
# premise), at the tasks' lr 1e-5. Where it still departs: B.2 applies the heads' dropout to the pooled embeddings.
THESIS_SIMCSE_FLAGS=(--simcse_objective pairwise --simcse_pairing product --simcse_lr 1e-5)
# The best recipe measured (cpu_best.sh, gpu_best.sh): per-task LoRA of rank 16 on every linear layer of a frozen
# encoder at lr 1e-3, QQP cross-encoded, SST ordinal, the sequential schedule with 2 cycles.
BEST_FLAGS=(--option pretrain --adapter lora --lr 1e-3 --cycles 2 --adapter_rank 16 --adapter_alpha 16
            --adapter_targets query,key,value,attention_output,ffn_in,ffn_out --pair_encoder qqp:cross
            --sst_objective ordinal)
# GPU (Colab L4 or better): bert-base-uncased, bf16 autocast, the thesis' schedule.
GPU_FLAGS=(--use_gpu --pretrained bert-base-uncased --option finetune --data_dir "$DATA_DIR" --seed "$SEED"
           --batch_size 32 --lr 2e-5 --hidden_dropout_prob 0.1 --max_length 128)
# CPU (2 cores): the bundled minilm-l6 and fewer cycles.
CPU_FLAGS=(--pretrained minilm-l6 --option finetune --data_dir "$DATA_DIR" --seed "$SEED"
           --batch_size 32 --lr 5e-5 --hidden_dropout_prob 0.1 --max_length 64)
# The offline NLI files of ../shared/data/nli (NLI_DIR) used by the CPU SimCSE stage: 9,380 triplets.
NLI_DIR="${NLI_DIR:-$ROOT/../shared/data/nli}"
CPU_NLI_FILES=("$NLI_DIR/generative_nli/snli/dev.jsonl" "$NLI_DIR/snli_senteval/s1.test" "$NLI_DIR/generative_nli/mnli/dev.jsonl"
               "$NLI_DIR/generative_nli/anli/test.jsonl" "$NLI_DIR/sick/SICK.txt")
# prediction_flags ARRAY NAME: the flags that send the six leaderboard CSVs of run NAME to $RUNS_DIR/NAME/predictions/
# (not the shared predictions/), into the array named ARRAY: one element a word, so that a path with a space (Google
# Drive's "My Drive") stays one argument, as "${ARRAY[@]}".
prediction_flags() {
    local -n _flags=$1
    local dir="$RUNS_DIR/$2/predictions"
    _flags=(--sst_dev_out "$dir/sst-dev-out.csv" --sst_test_out "$dir/sst-test-out.csv"
            --para_dev_out "$dir/para-dev-out.csv" --para_test_out "$dir/para-test-out.csv"
            --sts_dev_out "$dir/sts-dev-out.csv" --sts_test_out "$dir/sts-test-out.csv")
}
# SQuAD 2.0 (--tasks ...,qa): SQUAD_DIR holds train-v2.0.json, dev-v2.0.json and test-v2.0.json (default DATA_DIR, where
# scripts/download_data.py puts the official files; the CPU protocol's are in ../shared/data/squad).
SQUAD_DIR="${SQUAD_DIR:-$DATA_DIR}"
# squad_flags ARRAY NAME: SQuAD's files and its two predictions JSONs ($RUNS_DIR/NAME/predictions/squad-{dev,test}-out.json)
# for run NAME, into the array named ARRAY as prediction_flags does; without a test-v2.0.json (the official test set is
# hidden) only dev is predicted.
squad_flags() {
    local -n _flags=$1
    local dir="$RUNS_DIR/$2/predictions"
    _flags=(--squad_train "$SQUAD_DIR/train-v2.0.json" --squad_dev "$SQUAD_DIR/dev-v2.0.json"
            --squad_dev_out "$dir/squad-dev-out.json" --squad_test_out "$dir/squad-test-out.json")
    if [[ -f "$SQUAD_DIR/test-v2.0.json" ]]; then _flags+=(--squad_test "$SQUAD_DIR/test-v2.0.json"); fi
}
# Per-task baselines: each task fine-tuned alone into its own model (QQP 1 epoch, STS 3, SST 3).
# Usage: single_task_runs PREFIX FLAGS...   (writes $RUNS_DIR/PREFIX_single_{qqp,sts,sst}/)
# TASKS (environment) picks some of them, e.g. TASKS="sts sst".
single_task_runs() {
    local prefix=$1 stages name task predictions
    declare -A epochs=([qqp]='qqp' [sts]='sts*3' [sst]='sst*3')
    shift
    for task in ${TASKS:-qqp sts sst}; do
        stages=${epochs[$task]:?"TASKS: unknown task $task (use qqp, sts, sst)"}
        name="${prefix}_single_${task}"
        prediction_flags predictions "$name"
        $LAUNCH "$ROOT/multitask_classifier.py" "$@" --first_stages "$stages" --cycles 0 --output_dir "$RUNS_DIR/$name" \
            "${predictions[@]}"
    done
}
