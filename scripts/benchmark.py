"""Speed and memory benchmarks; every figure is a ratio or a number measured in this one run.

    python scripts/benchmark.py encoder    # minBERT vs transformers.BertModel train step (same weights, batch)
    python scripts/benchmark.py precision  # minBERT train step: float32 vs 16-bit autocast (bf16 / fp16)
    python scripts/benchmark.py smart      # SMART step vs plain step, and peak memory with and without SMART
    python scripts/benchmark.py memory     # live-tensor bytes of one QQP step: plain / SMART, checkpointing, 16-bit
    python scripts/benchmark.py adapters   # full fine-tuning vs LoRA / DoRA / PALs: parameters, size, time, memory
    python scripts/benchmark.py checkpointing  # train step with and without gradient checkpointing
    python scripts/benchmark.py pipeline   # tokens/s of the full training pipeline (tokenize, collate, step)
    python scripts/benchmark.py data_parallel  # 1 process vs 2 gloo processes (distributed.py), same global batch
    python scripts/benchmark.py ensemble   # one model's inference on dev + test vs combining 5 runs' saved scores
    python scripts/benchmark.py dev_eval   # a run's dev scoring after a stage: every dev example vs --max_eval_examples
    python scripts/benchmark.py all        # every benchmark above that runs on --device (data_parallel: the CPU's)
    python scripts/benchmark.py padding    # padded tokens of the length buckets (CUDA, --compile) on the train files
    python scripts/benchmark.py qqp_epoch  # one QQP SMART epoch of the course's 141,506 pairs, from timed real steps
    python scripts/benchmark.py step_audit # host syncs, operators and graph breaks of one training step (no timing)
    python scripts/benchmark.py captured_step  # the plain step eager vs captured whole (--capture_step; for CUDA)
    python scripts/benchmark.py qa_peer    # SQuAD 2.0: transformers' BertForQuestionAnswering peer (own flags, --help)

Defaults: minilm-l6, batch 32 x 64 tokens, 2 CPU threads, `--precision auto` resolved per device as training
does (runtime.resolve_precision: bf16 autocast where the device computes bf16 natively, fp16 autocast with a
gradient scaler on older GPUs such as a T4, float32 on other CPUs; `--bf16` / `--no-bf16` are aliases of
`--precision bf16` / `fp32`). `--config bert-base-random` uses a randomly initialised bert-base-sized model and
`--config random:NAME_OR_CONFIG_JSON` random weights of any checkpoint's or config.json's shape: no download.
The two sides of a comparison alternate, round after round, so drift in machine load hits both. minBERT runs as
training runs it (runtime.place_encoder: packed tokens on the CPU, the padded grid on CUDA; the batch's row lengths
known on the host); `--compile` compiles its layers (and, in `encoder`, times transformers compiled too).

Model FLOPs utilisation (MFU) sits beside each training-step time: the step's useful matmul FLOPs (6 x the layers'
weights x the real tokens, plus the attention's 12 x layers x hidden x length^2 per sequence; padding counts for
nothing) per second, over the device's peak in the step's precision: the published dense peak of known GPUs
(PEAK_TFLOPS), on a CPU the dense matmul throughput measured here (labelled so).

step_audit builds the Trainer as the training command line does (the recipes' flags, scripts/_common.sh: CPU_FLAGS on
the CPU, GPU_FLAGS on CUDA, with SMART_FLAGS for the SMART step) on --data_dir's real batches (default data/demo), and
counts one plain and one SMART step after a warm-up step (where the plain step runs bf16, the plain step again with
--bf16_weights: bf16 copies of the weights kept between steps, so that autocast casts none). Its last three lines:
    plain step with --bf16_weights: host syncs N, ops M (views V), weight casts W   (or why it was not counted)
    plain step: host syncs N, ops M (views V), weight casts W, graph breaks G
    smart step: host syncs N, ops M (views V), weight casts W, graph breaks of the whole step as --capture_step
        compiles it G
(views: operators that launch no kernel on a GPU; weight casts: dtype casts of the model's parameters; graph breaks:
torch._dynamo.explain's in the model's forward, its line above also gives them for the forward and loss, the whole
loss computation and the whole step as --capture_step compiles it, backward and AdamW's update included).
A flag the benchmarks cannot use is refused before anything loads, in one line naming it (exit code 2).
"""
from __future__ import annotations

import json
import sys

import torch

from base_bert import CheckpointError
from minbert.benchmarks.command_line import AUDIT_LINES, AUDITS, BENCHMARKS, chosen_kinds, parse_args
from minbert.benchmarks.qa_peer import qa_peer_main
from minbert.benchmarks.settings import describe
from minbert.benchmarks.timing import GRADIENT_SCALING
from minbert.files import DataError
from minbert.run.training_args import UsageError
from minbert.runtime import use_tf32


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["qa_peer"]:  # a training run with its own flags, not a timed kind
        return qa_peer_main(argv[1:])
    settings = parse_args(argv, __doc__)
    torch.set_num_threads(settings.threads)
    device = torch.device(settings.device)
    use_tf32(device)  # as training does: float32 matmuls through TF32 on CUDA
    for name in chosen_kinds(settings.which, device):
        GRADIENT_SCALING.clear()
        try:
            result = {**BENCHMARKS, **AUDITS}[name](settings, device)
        except (CheckpointError, DataError, UsageError) as err:  # an input found wrong once read: one line
            print(f"benchmark.py {name}: error: {err}", file=sys.stderr)
            return 2
        if GRADIENT_SCALING:
            result["fp16_skipped_steps"] = sum(record["skipped"] for record in GRADIENT_SCALING)
        result["setup"] = describe(settings, device)
        print(json.dumps(result, indent=2))
        if settings.json:
            with open(settings.json, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(result) + "\n")
        if name in AUDIT_LINES:
            print("\n".join(AUDIT_LINES[name](result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
