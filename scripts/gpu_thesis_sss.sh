#!/usr/bin/env bash
# The thesis' SMART-SBERT + SimCSE run (SSS), setting by setting (seed 000, section 4.2.2.3, tables 4.12-4.13: dev SST
# 0.507, QQP 0.864, STS r 0.843, overall 0.764): 3 epochs of supervised SimCSE on SNLI going on from the one with the
# best STS dev Pearson (--simcse_keep best; listing B.3; table 4.12 is that epoch's dev record), then figure 4.10's
# schedule as scripts/gpu_thesis_ss_cycles.sh: QQP -> [STS, SST, QQP 3%] x 10 keeping the model with the best
# overall dev score. NLI_FILES: the NLI files (the thesis used SNLI's training set). Every setting:
#  - SimCSE as section 3.2.4.3 and listings B.1-B.3 (THESIS_SIMCSE_FLAGS): the premise against its own entailment
#    and contradiction in a two-way softmax at tau 0.05 (--simcse_objective pairwise), every entailment of a premise
#    paired with every contradiction of it (--simcse_pairing product), mean pooling, lr 1e-5, batch 8;
#  - batch 8 for every task (SMART ran out of memory above it), dropout 0.1 before the heads;
#  - bert-base-uncased, mean pooling, SBERT pairs: QQP a sigmoid of W [u, v, |u - v|] with binary cross entropy, STS
#    2.5 cos + 2.5 with MSE and dropout on both embeddings before the cosine (listing A.6), SST cross entropy;
#  - AdamW at lr 1e-5 (not stated by the thesis: the course's fine-tuning default), constant, no clipping, float32
#    (its code has no autocast), texts cut at 512 tokens (its tokenizer's limit): THESIS_FLAGS;
#  - SMART as listings A.1-A.4 (THESIS_SMART_FLAGS): lambda_s 5 (10 for SST), mu 1, sigma = eps = 1e-5, eta 1e-3,
#    one ascent step normalised per example, the perturbation rescaled to inf-norm eps per example, R_s the batch
#    mean of each example's largest class term, the anchor's forward with dropout on, the momentum's
#    0.99 -> 0.999 switch after 10% of each epoch, D_Breg anchored to the weights the epoch started from.
# Where it still departs: the SimCSE batch size is the tasks' 8 (listing B.3 does not show its own), and the heads'
# dropout on the pooled embeddings of listing B.2 is not applied; scripts/_common.sh's THESIS_SMART_FLAGS lists what
# SMART does not copy; the seed and data order are the project's.
# Extra flags are passed on (e.g. --max_train_examples 2000, --cycles 1). Output: runs/gpu_thesis_sss/
# (runs/$RUN_NAME/ if set)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
NAME=${RUN_NAME:-gpu_thesis_sss}
prediction_flags PREDICTIONS "$NAME"
$LAUNCH "$ROOT/multitask_classifier.py" "${GPU_FLAGS[@]}" "${THESIS_SMART_FLAGS[@]}" "${THESIS_FLAGS[@]}" \
    "${THESIS_SIMCSE_FLAGS[@]}" --max_length 512 --batch_size 8 --hidden_dropout_prob 0.1 \
    --simcse_data ${NLI_FILES:?set NLI_FILES to NLI files} --simcse_epochs 3 --simcse_keep best \
    --first_stages qqp --cycle "sts,sst,qqp:0.03" --cycles 10 --output_dir "$RUNS_DIR/$NAME" "${PREDICTIONS[@]}" "$@"
