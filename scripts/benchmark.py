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
    python scripts/benchmark.py all
    python scripts/benchmark.py qa_peer    # SQuAD 2.0: transformers' BertForQuestionAnswering peer (own flags, --help)

Defaults: minilm-l6, batch 32 x 64 tokens, 2 CPU threads, `--precision auto` resolved per device as training
does (runtime.resolve_precision: bf16 autocast where the device computes bf16 natively, fp16 autocast with a
gradient scaler on older GPUs such as a T4, float32 on other CPUs; `--bf16` / `--no-bf16` are aliases of
`--precision bf16` / `fp32`). `--config bert-base-random` uses a randomly initialised bert-base-sized model and
`--config random:NAME_OR_CONFIG_JSON` random weights of any checkpoint's or config.json's shape: no download.
The two sides of a comparison alternate, round after round, so drift in machine load hits both.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import threading
import time
import weakref
from contextlib import nullcontext
from pathlib import Path
from queue import Empty

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from base_bert import BertConfig, resolve_pretrained  # noqa: E402
from bert import BertModel  # noqa: E402
from runtime import (PRECISIONS, autocast, float32_exact, has_native_bf16, precision_notice,  # noqa: E402
                     requested_precision, resolve_precision, scaled_step, use_tf32)
from optimizer import AdamW  # noqa: E402
import squad  # noqa: E402
from tokenizer import BertTokenizer  # noqa: E402


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_batch(batch_size: int, seq_len: int, vocab_size: int, device: torch.device, seed: int = 0,
               full_length: bool = False):
    """Random token ids and their attention mask: real lengths drawn from seq_len / 2 .. seq_len (the first
    sequence full), or all seq_len with `full_length` (no padding: the memory benchmark's worst case)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=generator)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size,), generator=generator)
    lengths[0] = seq_len
    if full_length:
        lengths[:] = seq_len
    mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


RANDOM = "random:"


def random_config(config: str, **overrides) -> BertConfig | None:
    """The BertConfig of a --config with random weights: bert-base's for "bert-base-random", a checkpoint's or a
    config.json's for "random:NAME_OR_PATH"; None for a pretrained checkpoint (weights to load)."""
    if config == "bert-base-random":
        return BertConfig(**overrides)
    if config.startswith(RANDOM):
        source = config[len(RANDOM):]
        file = Path(source).expanduser() if source.endswith(".json") else resolve_pretrained(source) / "config.json"
        return BertConfig.from_json_file(file, **overrides)
    return None


def random_twin(config: str) -> str:
    """The --config of random weights in the shape of `config` (itself when its weights are random already)."""
    return config if random_config_name(config) else RANDOM + config


def random_config_name(config: str) -> bool:
    return config == "bert-base-random" or config.startswith(RANDOM)


def build_minbert(args, **overrides) -> BertModel:
    """minBERT alone for --config: random weights (bert-base-random, random:NAME_OR_PATH) or pretrained;
    `overrides` change its config (e.g. attention_probs_dropout_prob)."""
    torch.manual_seed(0)
    config = random_config(args.config, **overrides)
    return BertModel(config) if config is not None else BertModel.from_pretrained(args.config, **overrides)


def build_tokenizer(args):
    """The tokenizer of --config; random weights of the bert-base-uncased vocabulary's size use the bundled
    minilm-l6's, which is that vocabulary."""
    config = random_config(args.config)
    if config is None:
        return BertTokenizer.from_pretrained(args.config)
    tokenizer = BertTokenizer.from_pretrained("minilm-l6")
    if config.vocab_size < tokenizer.vocab_size:
        raise SystemExit(f"--config {args.config}: a vocabulary of {config.vocab_size} is too small for real text "
                         f"(bert-base-uncased's has {tokenizer.vocab_size})")
    return tokenizer


def build_encoders(args, device):
    """minBERT and transformers.BertModel holding identical weights (random ones for a random --config: the
    transformers model's own initialisation, converted into minBERT)."""
    from transformers import BertConfig as HFConfig, BertModel as HFBertModel
    config = random_config(args.config)
    if config is not None:
        from base_bert import convert_hf_state_dict
        torch.manual_seed(0)
        ours = BertModel(config)
        hf_config = {k: v for k, v in config.to_dict().items() if k != "attn_implementation"}
        reference = HFBertModel(HFConfig(**hf_config, attn_implementation="sdpa"))
        ours.load_state_dict(convert_hf_state_dict(reference.state_dict(), config.num_hidden_layers))
    else:
        ours = BertModel.from_pretrained(args.config)
        reference = HFBertModel.from_pretrained(str(resolve_pretrained(args.config)), attn_implementation="sdpa")
    return ours.to(device).train(), reference.to(device).train()


def timed_steps(step, steps: int, device) -> list[float]:
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def alternate(steps: dict, args, device) -> dict[str, float]:
    """Median step time of each named step function, the sides alternating round after round."""
    for step in steps.values():  # warm-up: allocator, kernels, autotuning
        timed_steps(step, args.warmup, device)
    samples = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            samples[name] += timed_steps(step, args.steps, device)
    return {name: statistics.median(values) for name, values in samples.items()}


GRADIENT_SCALING: list[dict] = []  # {"skipped": n} of this benchmark's fp16 updates (not the updates: no
# reference to their optimizers and models)


class Update:
    """The backward pass and optimizer step of a training step as trainer.py takes them at `precision`: with fp16
    through a torch.amp.GradScaler (the loss scaled before backward; scaler.step skips the step when a gradient
    is inf or NaN and scaler.update then lowers the scale). No clipping here, so no unscale_ before the step."""

    def __init__(self, optimizer, device: torch.device, precision: str):
        self.optimizer = optimizer
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.record = {"skipped": 0}
        if self.scaler.is_enabled():
            GRADIENT_SCALING.append(self.record)

    def __call__(self, loss: torch.Tensor) -> bool:
        """Backward and step; False when the gradient scaler skipped the step."""
        self.scaler.scale(loss).backward()  # the loss itself when the scaler is disabled
        stepped = scaled_step(self.scaler, self.optimizer)
        self.record["skipped"] += not stepped
        return stepped


def train_step_fn(model, optimizer, ids, mask, device, precision: str, hf: bool):
    update = Update(optimizer, device, precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            if hf:
                out = model(input_ids=ids, attention_mask=mask)
                hidden, pooled = out.last_hidden_state, out.pooler_output
            else:
                out = model(ids, mask)
                hidden, pooled = out["last_hidden_state"], out["pooler_output"]
            loss = hidden.float().pow(2).mean() + pooled.float().pow(2).mean()
        update(loss)
    return step


def attention_operators(names) -> str:
    """The fused attention kernels among aten operator names (scaled_dot_product_attention's backends: flash,
    memory-efficient or cuDNN on CUDA, flash on the CPU), or "math" for none: its math path, whose (B, heads,
    T, T) softmax and dropout tensors are kept for the backward."""
    return ", ".join(sorted(n for n in names if "attention" in n and not n.endswith("_backward"))) or "math"


def attention_kernel(model: BertModel, ids, mask, device, precision: str) -> str:
    """Which kernel scaled_dot_product_attention picks for minBERT's attention in a training forward (its mask
    and dropout included)."""
    with LiveTensorBytes() as ops, autocast(device, precision):
        model(ids, mask)
    return attention_operators(ops.names)


def bench_encoder(args, device) -> dict:
    ours, reference = build_encoders(args, device)
    ids, mask = make_batch(args.batch_size, args.seq_len, ours.config.vocab_size, device)
    kernel = attention_kernel(ours, ids, mask, device, args.precision)
    steps = {
        "minbert": train_step_fn(ours, AdamW(ours.parameters(), lr=1e-5), ids, mask, device, args.precision,
                                 hf=False),
        "transformers": train_step_fn(reference, AdamW(reference.parameters(), lr=1e-5), ids, mask, device,
                                      args.precision, hf=True),
    }
    medians = alternate(steps, args, device)
    return {
        "benchmark": "encoder train step (forward, backward, AdamW)",
        "median_step_s": medians,
        "speedup_minbert_vs_transformers": medians["transformers"] / medians["minbert"],
        "minbert_attention_kernel": kernel,
    }


def sixteen_bit(args, device) -> str:
    """The 16-bit autocast that the precision benchmark sets against float32: on CUDA the device's (bf16 where
    it is native, else fp16); on the CPU the one --precision names, bf16 by default."""
    if device.type == "cuda":
        return "bf16" if has_native_bf16(device) else "fp16"
    return args.requested_precision if args.requested_precision in ("bf16", "fp16") else "bf16"


def bench_precision(args, device) -> dict:
    """minBERT train step in float32 against the same step under 16-bit autocast (same weights, batch); fp16
    steps go through a gradient scaler, as training's do."""
    half = sixteen_bit(args, device)
    ours = build_minbert(args).to(device).train()
    ids, mask = make_batch(args.batch_size, args.seq_len, ours.config.vocab_size, device)
    optimizer = AdamW(ours.parameters(), lr=1e-5)
    steps = {"float32": train_step_fn(ours, optimizer, ids, mask, device, "fp32", hf=False),
             f"{half}_autocast": train_step_fn(ours, optimizer, ids, mask, device, half, hf=False)}
    medians = alternate(steps, args, device)
    return {
        "benchmark": f"minBERT train step, float32 vs {half} autocast",
        "sixteen_bit": half,
        "median_step_s": medians,
        "speedup_16bit_vs_float32": medians["float32"] / medians[f"{half}_autocast"],
    }


def describe(args, device) -> dict:
    info = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
            "config": args.config, "batch": f"{args.batch_size}x{args.seq_len}",
            "python": platform.python_version(), "machine": platform.machine()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["native_bf16"] = has_native_bf16(device)
    info["precision"] = args.precision  # resolved: bf16, fp16 or fp32 (the precision benchmark sets its own)
    info["precision_notice"] = precision_notice(device, args.requested_precision)
    info["float32_matmul_precision"] = torch.get_float32_matmul_precision()  # "high": TF32 (runtime.use_tf32)
    return info


def multitask_setup(args, device, smart: bool, adapter: str | None = None, checkpointing: bool = False,
                    full_length: bool = False, **config_overrides):
    """A MultitaskBERT with its optimizer and (optionally) SMART on one fixed STS-like pair batch; with an
    adapter kind, per-task adapters of rank 8 over a frozen encoder; `full_length`: no padding."""
    from adapters import AdapterConfig
    from multitask_bert import MultitaskBERT, freeze_encoder
    from smart import SmartConfig, SmartRegularizer
    bert = build_minbert(args, **config_overrides)
    model = MultitaskBERT(bert, adapter=AdapterConfig(adapter) if adapter else None)
    if adapter:
        freeze_encoder(model)
    model.bert.encoder.gradient_checkpointing = checkpointing
    model = model.to(device).train()
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig()) if smart else None
    ids_1, mask_1 = make_batch(args.batch_size, args.seq_len, bert.config.vocab_size, device, 1, full_length)
    ids_2, mask_2 = make_batch(args.batch_size, args.seq_len, bert.config.vocab_size, device, 2, full_length)
    batch = {"input_ids_1": ids_1, "attention_mask_1": mask_1, "input_ids_2": ids_2, "attention_mask_2": mask_2,
             "labels": torch.rand(args.batch_size, device=device) * 5}
    return model, optimizer, regularizer, batch


def multitask_step_fn(model, optimizer, regularizer, batch, device, precision: str, task="qqp"):
    """One training step as trainer.py takes it: with SMART, compute_task_loss runs the whole loss in float32
    whatever the autocast around it."""
    from trainer import compute_task_loss
    if task == "qqp":
        batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
    update = Update(optimizer, device, precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = compute_task_loss(model, task, batch, regularizer)
        if update(loss) and regularizer is not None:
            regularizer.teacher.update(model)
    return step


def _memory_status(field: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS: resident now, VmHWM: peak resident)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _peak_memory_worker(args, device, smart, adapter, checkpointing, queue):
    torch.set_num_threads(args.threads)
    if device.type == "cpu":
        # Random weights of the same shape: loading a checkpoint would set a higher-water mark than a step.
        args = argparse.Namespace(**{**vars(args), "config": random_twin(args.config)})
    model, optimizer, regularizer, batch = multitask_setup(args, device, smart, adapter, checkpointing)
    small = {k: v[:1, :8] if v.dim() == 2 else v[:1] for k, v in batch.items()}
    # A float32 step creates the optimizer state (an fp16 gradient scaler could skip the step that would).
    multitask_step_fn(model, optimizer, regularizer, small, device, "fp32")()
    # Without the gradients of that step: every step frees them first (set_to_none) and makes them anew, so
    # they belong to the step's memory, not the base (else full fine-tuning's 87 MiB of them go uncounted).
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current size
        base = _memory_status("VmRSS")
    step = multitask_step_fn(model, optimizer, regularizer, batch, device, args.precision)
    for _ in range(2):
        step()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _memory_status("VmHWM")
    queue.put(peak - base)


def peak_step_memory(args, device, smart: bool, adapter: str | None = None, checkpointing: bool = False) -> int:
    """Peak memory a training step adds over the loaded model, measured in a fresh process
    (CPU: peak resident set size; CUDA: peak allocated bytes)."""
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_peak_memory_worker, args=(args, device, smart, adapter, checkpointing, queue))
    process.start()
    while True:  # a worker that fails (its traceback on stderr) is an error here, not a wait forever
        try:
            value = queue.get(timeout=1)
            break
        except Empty:
            if not process.is_alive():
                raise RuntimeError(f"the memory probe's process failed (exit code {process.exitcode}): "
                                   "its traceback is above") from None
    process.join()
    return value


def smart_phase_fns(model, regularizer, batch, task="qqp") -> dict:
    """The passes of a SMART step, each as a function timed on its own (forwards include the clean one
    they need): where a SMART step's time goes. Each runs in exact float32, as the SMART step does
    (compute_task_loss) whatever the run's precision."""
    from smart import find_perturbation
    batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
    model.set_adapter(task)
    inputs = model.encoder_inputs(task, batch)
    objective = model.objectives[task]

    def clean():
        embeddings = model.embed(inputs)
        return model.outputs_from_embeddings(task, embeddings, inputs), embeddings

    def forward_fn(embeddings):
        return model.outputs_from_embeddings(task, embeddings, inputs)

    def ascent():
        outputs, embeddings = clean()
        find_perturbation(forward_fn, embeddings, outputs, objective.divergence, regularizer.config)

    def as_in_smart_step(fn):
        def run():
            model.zero_grad(set_to_none=True)
            with float32_exact():
                fn()
        return run
    return {
        "clean forward": as_in_smart_step(clean),
        "clean forward + backward": as_in_smart_step(lambda: objective.loss(clean()[0], batch["labels"]).backward()),
        "clean forward + ascent step": as_in_smart_step(ascent),
        "clean forward + perturbed forward": as_in_smart_step(lambda: forward_fn(clean()[1])),
        "teacher forward": as_in_smart_step(lambda: regularizer.teacher(model, task, batch)),
    }


class TransformersSbertQQP(torch.nn.Module):
    """The benchmark's QQP SBERT model on transformers.BertModel: mean pooling, [u, v, |u - v|], linear.
    SMART perturbs its word embeddings (passed as inputs_embeds), as SMART written on transformers does."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert
        self.head = torch.nn.Linear(3 * bert.config.hidden_size, 1)

    def outputs_from_word_embeddings(self, word_embeddings, mask):
        from multitask_bert import mean_pool
        hidden = self.bert(inputs_embeds=word_embeddings, attention_mask=mask).last_hidden_state  # (2B, T, H)
        u, v = mean_pool(hidden, mask).chunk(2)  # (B, H) each
        return self.head(torch.cat([u, v, (u - v).abs()], dim=-1)).squeeze(-1)  # (B,)

    def forward(self, ids, mask):
        return self.outputs_from_word_embeddings(self.bert.embeddings.word_embeddings(ids), mask)


def transformers_step_fn(args, device, smart: bool):
    """A plain or SMART QQP step of TransformersSbertQQP on the same batch as multitask_setup's, with this
    project's SMART functions (one ascent step, gradient to the perturbation only, teacher without gradient);
    a SMART step in exact float32, as compute_task_loss runs this code's."""

    from smart import SmartConfig, SmartRegularizer
    _, reference = build_encoders(args, device)
    model = TransformersSbertQQP(reference).to(device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig()) if smart else None
    (ids_1, mask_1), (ids_2, mask_2) = (make_batch(args.batch_size, args.seq_len, reference.config.vocab_size,
                                                   device, seed=seed) for seed in (1, 2))
    ids, mask = torch.cat([ids_1, ids_2]), torch.cat([mask_1, mask_2])  # (2B, T): both sides in one pass
    labels = (torch.rand(args.batch_size, device=device) > 0.5).float()
    update = Update(optimizer, device, args.precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, args.precision), float32_exact() if smart else nullcontext():
            embeddings = model.bert.embeddings.word_embeddings(ids)

            def forward_fn(e):
                return model.outputs_from_word_embeddings(e, mask)
            logits = forward_fn(embeddings)
            loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
            if regularizer is not None:
                loss = loss + regularizer.penalty(forward_fn, embeddings, logits, "bernoulli", teacher_args=(ids, mask))
        if update(loss) and regularizer is not None:
            regularizer.teacher.update(model)
    return step


def bench_smart(args, device) -> dict:
    """SMART step (clean forward, 1 ascent step, perturbed forward, teacher forward) vs a plain step, here
    and with the same SMART functions around transformers.BertModel (its ratio is the issue's yardstick)."""
    steps = {}
    for name, smart in (("plain", False), ("smart", True)):
        model, optimizer, regularizer, batch = multitask_setup(args, device, smart)
        steps[name] = multitask_step_fn(model, optimizer, regularizer, batch, device, args.precision)
        steps[f"transformers_{name}"] = transformers_step_fn(args, device, smart)
    medians = alternate(steps, args, device)
    phases = alternate(smart_phase_fns(model, regularizer, batch), args, device)
    memory = {name: peak_step_memory(args, device, name == "smart") for name in ("plain", "smart")}
    return {
        "benchmark": "QQP SBERT train step with and without SMART",
        "median_step_s": medians,
        "smart_cost_ratio": medians["smart"] / medians["plain"],
        "transformers_smart_cost_ratio": medians["transformers_smart"] / medians["transformers_plain"],
        "smart_step_speedup_vs_transformers": medians["transformers_smart"] / medians["smart"],
        "smart_phase_s": {name: round(value, 4) for name, value in phases.items()},
        "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()},
        "teacher_copy_mib": round(sum(t.numel() * t.element_size() for t in regularizer.teacher.params.values())
                                  / 2**20, 1),
        "smart_memory_ratio": memory["smart"] / max(memory["plain"], 1),
    }


def bench_pipeline(args, device) -> dict:
    """Real-text training throughput: loading, tokenizing, collating, forward, backward, AdamW."""
    from datasets import load_sentence_examples, make_dataloader
    from multitask_bert import MultitaskBERT
    from trainer import compute_task_loss
    data = Path(args.data_dir) / "ids-sst-train.csv"
    examples = load_sentence_examples(data, "sst", "train")
    tokenizer = build_tokenizer(args)
    model = MultitaskBERT(build_minbert(args)).to(device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5)
    update = Update(optimizer, device, args.precision)
    loader = make_dataloader(examples, tokenizer, args.batch_size, shuffle=True, seed=0, max_length=args.seq_len)
    tokens, batches = 0, 0
    start = None
    for index, batch in enumerate(loader):
        if index == args.warmup:
            synchronize(device)
            start = time.perf_counter()
        if index >= args.warmup:
            tokens += int(batch["attention_mask"].sum())
            batches += 1
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, args.precision):
            loss = compute_task_loss(model, "sst", batch)
        update(loss)
        if batches == args.steps * args.rounds:
            break
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"benchmark": f"SST training pipeline on {data}", "batches": batches, "real_tokens": tokens,
            "seconds": seconds, "tokens_per_second": tokens / seconds}


def bench_adapters(args, device) -> dict:
    """Full fine-tuning against per-task LoRA, DoRA (rank 8 on query and value) and PALs over a frozen
    encoder: trainable parameters, checkpoint size, train-step time and peak step memory."""
    import tempfile
    from multitask_bert import save_multitask_model
    kinds = {"full fine-tuning": None, "lora": "lora", "dora": "dora", "pals": "pals"}
    steps, sizes, trainable = {}, {}, {}
    for name, kind in kinds.items():
        model, optimizer, _, batch = multitask_setup(args, device, False, kind)
        steps[name] = multitask_step_fn(model, optimizer, None, batch, device, args.precision)
        trainable[name] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        with tempfile.TemporaryDirectory() as folder:
            save_multitask_model(model, Path(folder) / "model", {})
            sizes[name] = (Path(folder) / "model.safetensors").stat().st_size
    medians = alternate(steps, args, device)
    memory = {name: peak_step_memory(args, device, False, kind) for name, kind in kinds.items()}
    return {"benchmark": "QQP SBERT train step: full fine-tuning vs per-task adapters over a frozen encoder",
            "trainable_parameters": trainable, "checkpoint_mib": {k: round(v / 2**20, 2) for k, v in sizes.items()},
            "median_step_s": medians, "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()}}


def bench_checkpointing(args, device) -> dict:
    """A QQP SBERT train step with and without --gradient_checkpointing: time and peak step memory."""
    steps = {}
    for name, checkpointing in (("plain", False), ("checkpointed", True)):
        model, optimizer, _, batch = multitask_setup(args, device, False, checkpointing=checkpointing)
        steps[name] = multitask_step_fn(model, optimizer, None, batch, device, args.precision)
    medians = alternate(steps, args, device)
    memory = {name: peak_step_memory(args, device, False, checkpointing=name == "checkpointed") for name in steps}
    return {"benchmark": "QQP SBERT train step with and without gradient checkpointing",
            "median_step_s": medians, "checkpointing_time_ratio": medians["checkpointed"] / medians["plain"],
            "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()},
            "checkpointing_memory_ratio": memory["checkpointed"] / max(memory["plain"], 1)}


class LiveTensorBytes(TorchDispatchMode):
    """The bytes of the tensor storages that operators create while it is active and that are still alive, and
    their peak: what a computation adds to the memory already held (weights, optimizer state), at operator
    granularity. Each storage counts once, from the operator whose output it is (views and in-place results
    share their input's storage and add nothing) until it is freed (a weakref finalizer on the storage). The
    backward pass is seen too (autograd runs it with this thread's dispatch modes). Not seen: what a kernel
    allocates and frees inside itself (workspaces), and on CUDA the caching allocator's rounding (to 512-byte
    blocks) and fragmentation, which torch.cuda.max_memory_allocated includes. Also records operator names."""

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self.live: set[int] = set()  # the storages counted and still alive, by address of their StorageImpl
        self.names: set[str] = set()
        self.lock = threading.RLock()  # finalizers may run on autograd's threads, or inside a dispatch here

    def _freed(self, key: int, nbytes: int) -> None:
        with self.lock:
            self.live.discard(key)
            self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.names.add(func.overloadpacket.__name__)
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
            with self.lock:
                if key in inputs or key in self.live:
                    continue
                self.live.add(key)
                self.current += nbytes
                self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out


class FloatMatmuls(TorchDispatchMode):
    """Matrix products (and the CPU's flash attention) of bf16 / fp16 tensors computed in float32, their outputs
    rounded to the dtypes the 16-bit kernels return (read off the operator's meta kernel): the same tensors, of
    the same sizes, without the 16-bit kernels that a CPU lacking them emulates (two orders of magnitude slower
    than float32 on an AVX2 CPU). For counting memory under LiveTensorBytes entered after it (which then sees
    the 16-bit operator and its 16-bit output, not the float32 copies); never for timing."""

    OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten.baddbmm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
           torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
    SIXTEEN_BIT = (torch.bfloat16, torch.float16)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.OPS or not any(isinstance(t, torch.Tensor) and t.dtype in self.SIXTEEN_BIT
                                           for t in tree_flatten((args, kwargs))[0]):
            return func(*args, **kwargs)
        meta_args, meta_kwargs = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs))
        dtypes = [t.dtype if isinstance(t, torch.Tensor) else None
                  for t in tree_flatten(func(*meta_args, **meta_kwargs))[0]]
        upcast = (lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in self.SIXTEEN_BIT else t)
        outputs, spec = tree_flatten(func(*tree_map(upcast, args), **tree_map(upcast, kwargs)))
        return tree_unflatten([t.to(dtype) if dtype is not None and t.dtype != dtype else t
                               for t, dtype in zip(outputs, dtypes)], spec)


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages that `tensors` hold."""
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


MEMORY_ROWS = {  # name: (SMART, gradient checkpointing, 16-bit autocast)
    "plain": (False, False, False),
    "plain, checkpointing": (False, True, False),
    "plain, 16-bit": (False, False, True),
    "plain, 16-bit, checkpointing": (False, True, True),
    "SMART": (True, False, False),
    "SMART, checkpointing": (True, True, False),
}
CUDA_CONTEXT_GIB = 0.5  # an assumption (CUDA context and kernels), to be checked on a GPU: see BENCHMARKS.md


def emulates_sixteen_bit(device: torch.device, precision: str) -> bool:
    """Whether the device computes this 16-bit precision's matmuls by emulation (CPUs without the instructions)."""
    return device.type == "cpu" and precision != "fp32" and not (precision == "bf16" and has_native_bf16(device))


def step_memory(args, device, smart: bool, checkpointing: bool, precision: str, fused_attention: bool,
                float_matmuls: bool | None = None) -> dict:
    """Bytes of one QQP SBERT training step over the loaded model and optimizer state (LiveTensorBytes' peak,
    the gradients the step makes included), and the static bytes held across steps. `fused_attention` on the
    CPU: attention dropout off, so that scaled_dot_product_attention runs the CPU's flash kernel, which keeps
    what CUDA's fused kernels keep for the backward (output and log-sum-exp, dropout replayed from a seed);
    with dropout on, the CPU runs the math path, which keeps (B, heads, T, T) probabilities and masks.
    `float_matmuls` (by default where 16-bit is emulated): FloatMatmuls, the same bytes in a fraction of the time."""
    if float_matmuls is None:
        float_matmuls = emulates_sixteen_bit(device, precision)
    overrides = {"attention_probs_dropout_prob": 0.0} if fused_attention and device.type == "cpu" else {}
    model, optimizer, regularizer, batch = multitask_setup(args, device, smart, checkpointing=checkpointing,
                                                           full_length=True, **overrides)
    small = {k: v[:1, :8] if v.dim() == 2 else v[:1] for k, v in batch.items()}
    multitask_step_fn(model, optimizer, regularizer, small, device, "fp32")()  # the AdamW state now exists
    optimizer.zero_grad(set_to_none=True)  # every step frees the gradients first and makes them anew
    step = multitask_step_fn(model, optimizer, regularizer, batch, device, precision)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    with FloatMatmuls() if float_matmuls else nullcontext(), LiveTensorBytes() as counter:
        step()
    synchronize(device)
    figures = {
        "step_peak": counter.peak, "step_s": time.perf_counter() - start,
        "attention": attention_operators(counter.names),
        "weights": tensor_bytes([*model.parameters(), *model.buffers()]),
        "gradients": tensor_bytes(p.grad for p in model.parameters() if p.grad is not None),
        "adamw_states": tensor_bytes(t for state in optimizer.state.values() for t in state.values()
                                     if torch.is_tensor(t)),
        "smart_teacher_copy": tensor_bytes(regularizer.teacher.params.values()) if smart else 0}
    if device.type == "cuda":
        figures["cuda_peak_allocated"] = torch.cuda.max_memory_allocated(device) - base
    return figures


def bench_memory(args, device) -> dict:
    """Peak memory of one QQP SBERT training step, counted tensor by tensor (LiveTensorBytes), for every
    sequence of the batch full length (the worst case): plain and SMART steps (SMART computes in float32
    whatever the precision: trainer.compute_task_loss), with and without gradient checkpointing, plain steps
    in float32 and 16-bit autocast (bf16 and fp16 keep activations in 2 bytes alike). On the CPU every row is
    measured twice: with the attention the CPU runs in training (the math path: dropout rules out its fused
    kernel) and with a fused kernel's memory (as CUDA runs it); on CUDA once, as it runs. The GPU estimate of
    a row: weights + AdamW states (+ SMART's teacher copy) + the step's peak with fused attention
    + CUDA_CONTEXT_GIB."""
    half = sixteen_bit(args, device)
    variants = {"fused_attention": True, "attention_as_run_here": False} if device.type == "cpu" else {
        "attention_as_run_here": True}
    rows, static, kernels = {}, {}, {}
    for name, (smart, checkpointing, sixteen) in MEMORY_ROWS.items():
        rows[name] = {"precision": "fp32 (SMART: float32 always)" if smart else half if sixteen else "fp32"}
        for variant, fused in variants.items():
            figures = step_memory(args, device, smart, checkpointing, half if sixteen else "fp32", fused)
            gc.collect()
            print(f"memory: {name}, {variant}: step peak {figures['step_peak'] / 2**20:.1f} MiB "
                  f"({figures['step_s']:.1f} s)", file=sys.stderr, flush=True)
            rows[name][f"step_peak_mib_{variant}"] = round(figures["step_peak"] / 2**20, 1)
            rows[name][f"step_s_{variant}"] = round(figures["step_s"], 2)
            if "cuda_peak_allocated" in figures:
                rows[name]["cuda_peak_allocated_mib"] = round(figures["cuda_peak_allocated"] / 2**20, 1)
            # The plain step's: SMART's teacher forward, in eval mode, has no dropout to keep it off the flash kernel.
            kernels.setdefault(variant, figures["attention"])
            for key in ("weights", "gradients", "adamw_states", "smart_teacher_copy"):
                static[key] = max(static.get(key, 0), figures[key])
            if fused:
                held = figures["weights"] + figures["adamw_states"] + figures["smart_teacher_copy"]
                rows[name]["held_across_steps_mib"] = round(held / 2**20, 1)
                rows[name]["gpu_estimate_gib"] = round((held + figures["step_peak"]) / 2**30 + CUDA_CONTEXT_GIB, 2)
    return {"benchmark": f"peak live-tensor memory of one QQP SBERT training step, {args.batch_size} pairs x "
                         f"{args.seq_len} tokens, no padding",
            "sixteen_bit": half, "attention_kernels": kernels,
            "sixteen_bit_matmuls": "in float32, rounded to 16 bits (FloatMatmuls: the same tensors; this device "
                                   "emulates 16-bit matmuls)" if emulates_sixteen_bit(device, half) else "native",
            "static_mib": {k: round(v / 2**20, 1) for k, v in static.items()},
            "cuda_context_gib_assumed": CUDA_CONTEXT_GIB, "rows": rows}


def _data_parallel_worker(rank: int, world_size: int, port: int, args, results) -> None:
    """One rank of the data-parallel benchmark: QQP SBERT train steps on a per-rank slice of the global batch,
    gradients averaged by distributed.py; rank 0 reports the median step and all-reduce times."""
    import os
    from distributed import Distributed
    from trainer import compute_task_loss
    if world_size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world_size))
    torch.set_num_threads(max(1, args.threads // world_size))
    distributed, _ = Distributed.from_environment(use_gpu=False)
    local = argparse.Namespace(**{**vars(args), "batch_size": args.batch_size // world_size})
    cpu = torch.device("cpu")
    model, optimizer, _, batch = multitask_setup(local, cpu, False)
    batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
    update = Update(optimizer, cpu, args.precision)
    step_times, reduce_times = [], []
    for index in range(args.warmup + args.steps * args.rounds):
        distributed.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast(cpu, args.precision):
            loss = compute_task_loss(model, "qqp", batch)
        update.scaler.scale(loss).backward()  # a disabled scaler (bf16, fp32) passes the loss and the step through
        reduce_start = time.perf_counter()
        distributed.average_gradients(model.parameters())
        reduce_end = time.perf_counter()
        update.scaler.step(optimizer)
        update.scaler.update()
        distributed.barrier()
        if index >= args.warmup:
            step_times.append(time.perf_counter() - start)
            reduce_times.append(reduce_end - reduce_start)
    if rank == 0:
        results.put((statistics.median(step_times), statistics.median(reduce_times)))
    distributed.shutdown()


def bench_data_parallel(args, device) -> dict:
    """The same global batch trained by one process with all threads and by two gloo processes with half
    the threads each: examples per second and the all-reduce's share of a step."""
    import socket
    import torch.multiprocessing as mp
    if device.type != "cpu":
        raise SystemExit("data_parallel measures gloo processes on the CPU; on GPUs time a torchrun run instead")
    context = mp.get_context("spawn")
    figures = {}
    for processes in (1, 2):
        results = context.Queue()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.spawn(_data_parallel_worker, args=(processes, port, args, results), nprocs=processes, join=True)
        step, reduce = results.get()
        figures[f"{processes} process(es) x {max(1, args.threads // processes)} thread(s)"] = {
            "median_step_s": step, "examples_per_s": args.batch_size / step, "all_reduce_s": reduce}
    return {"benchmark": f"QQP SBERT train step, global batch {args.batch_size}: one process vs two gloo processes",
            "figures": figures}


def bench_ensemble(args, device) -> dict:
    """What an ensemble costs at prediction time: one model's inference on the real dev and test files of
    --data_dir (the six leaderboard splits), against combining five members' saved scores of the same sizes
    (ensemble_scores.combine); the members' own inference is paid once, at the end of their runs."""
    from datasets import load_split
    from ensemble_scores import combine
    from multitask_bert import MultitaskBERT
    from tasks import MULTITASK
    from trainer import predict_examples
    model = MultitaskBERT(build_minbert(args)).to(device).eval()
    tokenizer = build_tokenizer(args)
    splits = {(t, s): load_split(args.data_dir, t, s) for t in MULTITASK for s in ("dev", "test")}
    seconds = {}
    for (task, split), examples in splits.items():
        synchronize(device)
        start = time.perf_counter()
        predict_examples(model, task, examples, tokenizer, device, 64, args.seq_len, args.precision, scores=True)
        synchronize(device)
        seconds[f"{task}-{split}"] = time.perf_counter() - start
    generator = np.random.default_rng(0)
    members = {key: [generator.normal(size=(len(examples), 5) if key[0] == "sst" else len(examples))
                     for _ in range(5)] for key, examples in splits.items()}
    methods = {"sst": "vote", "qqp": "vote", "sts": "mean"}
    start = time.perf_counter()
    for (task, _), scores in members.items():
        combine(task, scores, methods[task])
    combine_seconds = time.perf_counter() - start
    return {"benchmark": f"prediction: one model's inference on the {sum(len(e) for e in splits.values())} dev + test "
                         f"examples of {args.data_dir} vs combining 5 members' saved scores",
            "one_model_inference_s": sum(seconds.values()), "per_split_s": seconds,
            "combine_5_members_s": combine_seconds}


# ---------------------------------------------------------------------------------------------------
# qa_peer: the SQuAD 2.0 peer, its own command line (python scripts/benchmark.py qa_peer --help)

QA_PEER_DOC = """benchmark.py qa_peer, the peer run for SQuAD 2.0: transformers' BertForQuestionAnswering on this
project's weights, data, windows and machine (transformers stays a test / benchmark dependency).

    python scripts/benchmark.py qa_peer --out runs/qa_peer.json            # train 1 epoch, evaluate on dev
    python scripts/benchmark.py qa_peer --max_train_examples 200 --out /tmp/peer.json     # a smoke run
    python scripts/benchmark.py qa_peer --compare_steps 20 --out /tmp/steps.json
        # same batches: minBERT span model vs transformers, seconds per step

What is shared with this project's own QA run: the pretrained directory (`base_bert.resolve_pretrained`), the
tokenizer (`tokenizer.BertTokenizer`), the questions (`squad.load_squad`), the windows and their gold labels
(`squad.QAWindows.build`: [CLS] question [SEP] piece [SEP], doc_stride overlap, [CLS] when the window lacks the
answer), the batches (`QAWindows.collate`), the decoding and the official metric (`squad.decode_answers`,
`best_threshold`, `squad_metrics`). What is transformers': the model (`BertForQuestionAnswering.from_pretrained`,
whose qa_outputs head is new and initialised under --seed) and its loss (start and end cross-entropy, averaged).

Training as transformers' run_qa.py users run it by default: every window padded to --max_length
(--pad_to_max_length), a seeded random order, torch.optim.AdamW (weight decay 0), a constant learning rate (the
project's default schedule), no gradient clipping, float32. Evaluation pads each batch only to its longest window
(windows sorted by length; padding does not change a window's logits beyond float noise).

--compare_steps N times N training steps of minBERT with a linear span head (the project's encoder and its
optimizer.AdamW) against transformers' BertForQuestionAnswering on identical batches, the two alternating step by
step, and exits without the full training run.
"""
QA_SKIPPED_STEPS = 5  # steps left out of the mean step time (allocator and kernel warm-up)
QA_EVAL_BATCH_SIZE = 64
QA_COMPARE_WARMUP = 2  # untimed steps per side before --compare_steps' timed ones
QA_METRIC_KEYS = ("em", "f1", "has_answer_em", "has_answer_f1", "no_answer_em", "no_answer_f1")


def qa_peer_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmark.py qa_peer", description=QA_PEER_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data" / "squad"),
                        help="folder with train-v2.0.json and dev-v2.0.json")
    parser.add_argument("--pretrained", default="minilm-l6", help="a name or directory for resolve_pretrained")
    parser.add_argument("--max_length", type=int, default=384)
    parser.add_argument("--doc_stride", type=int, default=128)
    parser.add_argument("--max_answer_tokens", type=int, default=30)
    parser.add_argument("--n_best", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=11711)
    parser.add_argument("--max_train_examples", type=int, default=None,
                        help="train on a seeded random sample of this many questions (smoke tests)")
    parser.add_argument("--pad_to_max_length", action=argparse.BooleanOptionalAction, default=True,
                        help="pad every training window to --max_length (run_qa.py's default); "
                             "--no-pad_to_max_length pads each batch to its longest window")
    parser.add_argument("--compare_steps", type=int, default=0,
                        help="only time N training steps of minBERT + span head vs transformers on the same batches")
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    for name in ("max_length", "doc_stride", "max_answer_tokens", "n_best", "batch_size", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.max_train_examples is not None and args.max_train_examples < 1:
        parser.error("--max_train_examples must be at least 1")
    if args.compare_steps < 0:
        parser.error("--compare_steps must be >= 0")
    return args


# -- data ------------------------------------------------------------------------------------------

def qa_load_split(args, split: str, tokenizer, limit: int | None = None) -> squad.QAWindows:
    examples = squad.load_squad(Path(args.data_dir) / f"{split}-v2.0.json", split)
    if limit is not None and limit < len(examples):
        keep = sorted(random.Random(args.seed).sample(range(len(examples)), limit))  # file order kept
        examples = [examples[i] for i in keep]
    return squad.QAWindows.build(examples, tokenizer, args.max_length, args.doc_stride)


def qa_batch_of(windows: squad.QAWindows, indices, pad_to: int | None = None) -> dict:
    """windows.collate(indices), padded further to `pad_to` tokens (pad id 0, mask 0, segment 0) when given."""
    batch = windows.collate(indices)
    extra = 0 if pad_to is None else pad_to - batch["input_ids"].shape[1]
    if extra > 0:
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            batch[key] = F.pad(batch[key], (0, extra), value=0)
    return batch


def qa_training_batches(windows: squad.QAWindows, args, epoch: int) -> list[list[int]]:
    """A seeded random permutation of the windows (a new one each epoch), cut into batches of batch_size."""
    order = np.random.RandomState(args.seed + epoch).permutation(len(windows)).tolist()
    return [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]


# -- the two models --------------------------------------------------------------------------------

def qa_transformers_model(directory: Path, seed: int):
    """BertForQuestionAnswering from the pretrained directory; qa_outputs is new, initialised under `seed`.
    Returns the model and transformers' loading info (missing / unexpected keys)."""
    from transformers import BertForQuestionAnswering
    torch.manual_seed(seed)
    model, info = BertForQuestionAnswering.from_pretrained(str(directory), output_loading_info=True)
    info = {key: sorted(str(k) for k in value) for key, value in info.items() if isinstance(value, (list, set))}
    return model, info


def qa_transformers_loss(model, batch) -> torch.Tensor:
    labels = batch["labels"]
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"], start_positions=labels[:, 0],
                 end_positions=labels[:, 1]).loss


class MinbertSpan(nn.Module):
    """minBERT with a linear (hidden -> start, end) head on its last hidden states: the stand-in for the project's
    QA model in --compare_steps, with transformers' loss (start and end cross-entropy, averaged)."""

    def __init__(self, bert, head: nn.Linear):
        super().__init__()
        self.bert, self.qa_outputs = bert, head

    def forward(self, batch) -> torch.Tensor:
        hidden = self.bert.encode(self.bert.embed(batch["input_ids"], batch["token_type_ids"]),
                                  batch["attention_mask"])  # (B, T, H); no key mask when nothing is padding
        start, end = self.qa_outputs(hidden).unbind(-1)  # (B, T) each
        labels = batch["labels"]
        return (F.cross_entropy(start, labels[:, 0]) + F.cross_entropy(end, labels[:, 1])) / 2


def minbert_span_model(directory: Path, reference) -> MinbertSpan:
    """minBERT from the same directory, with a copy of the transformers model's qa_outputs as its head."""
    bert = BertModel.from_pretrained(directory)
    head = nn.Linear(bert.config.hidden_size, 2)
    with torch.no_grad():
        head.weight.copy_(reference.qa_outputs.weight)
        head.bias.copy_(reference.qa_outputs.bias)
    return MinbertSpan(bert, head)


def qa_timed_step(loss_fn, optimizer, batch) -> float:
    """One training step (forward, backward, optimizer step); its wall-clock seconds."""
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(batch)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


# -- training and evaluation -----------------------------------------------------------------------

def qa_train(model, windows: squad.QAWindows, args) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)  # constant rate, no clipping
    pad_to = args.max_length if args.pad_to_max_length else None
    model.train()
    torch.manual_seed(args.seed)  # dropout
    step_times, losses = [], []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for indices in qa_training_batches(windows, args, epoch):
            batch = qa_batch_of(windows, indices, pad_to)
            step_start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = qa_transformers_loss(model, batch)
            loss.backward()
            optimizer.step()
            step_times.append(time.perf_counter() - step_start)
            losses.append(loss.item())
    train_seconds = time.perf_counter() - start
    timed = step_times[QA_SKIPPED_STEPS:] or step_times  # a run of <= 5 steps: all of them
    return {"steps": len(step_times), "timed_steps": len(timed), "step_seconds": statistics.mean(timed),
            "step_seconds_median": statistics.median(timed), "train_seconds": train_seconds,
            "first_loss": losses[0], "last_loss": losses[-1],
            "mean_loss_last_10pct": statistics.mean(losses[-max(1, len(losses) // 10):]),
            "all_step_seconds": [round(t, 4) for t in step_times]}


@torch.inference_mode()
def qa_window_logits(model, windows: squad.QAWindows, max_length: int) -> np.ndarray:
    """(N, max_length, 2) start / end logits of every window (zeros past a window's length)."""
    model.eval()
    logits = np.zeros((len(windows), max_length, 2), dtype=np.float32)
    order = sorted(range(len(windows)), key=lambda i: windows.lengths[i])
    for i in range(0, len(order), QA_EVAL_BATCH_SIZE):
        indices = order[i:i + QA_EVAL_BATCH_SIZE]
        batch = qa_batch_of(windows, indices)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
        stacked = torch.stack([out.start_logits, out.end_logits], dim=-1).float().numpy()  # (B, T, 2)
        logits[indices, :stacked.shape[1]] = stacked
    return logits


def qa_evaluate(model, windows: squad.QAWindows, args) -> dict:
    start = time.perf_counter()
    logits = qa_window_logits(model, windows, args.max_length)
    answers = squad.decode_answers(windows, logits, args.n_best, args.max_answer_tokens)
    examples = windows.examples
    tau = squad.best_threshold(answers, examples)
    at_zero = squad.squad_metrics(squad.predictions(answers, 0.0), examples)
    tuned = squad.squad_metrics(squad.predictions(answers, tau), examples)
    pick = lambda metrics, threshold: {**{k: metrics[k] for k in QA_METRIC_KEYS if k in metrics}, "tau": threshold}  # noqa: E731
    return {"tau0": pick(at_zero, 0.0), "tuned": pick(tuned, tau), "eval_seconds": time.perf_counter() - start}


# -- same batches: minBERT span model vs transformers ----------------------------------------------

def qa_compare_steps(args, directory: Path, windows: squad.QAWindows, steps: int) -> dict:
    """`steps` training steps of minBERT + a span head and of BertForQuestionAnswering on identical batches (the
    first batches of the training order, padded as --pad_to_max_length says), after QA_COMPARE_WARMUP untimed steps
    each; the two alternate step by step (which goes first alternating too), so machine drift hits both."""
    reference, _ = qa_transformers_model(directory, args.seed)
    ours = minbert_span_model(directory, reference)
    reference.train(), ours.train()
    sides = {
        "transformers": (lambda batch: qa_transformers_loss(reference, batch),
                         torch.optim.AdamW(reference.parameters(), lr=args.lr, weight_decay=0.0)),
        "minbert": (ours, AdamW(ours.parameters(), lr=args.lr, weight_decay=0.0)),
    }
    pad_to = args.max_length if args.pad_to_max_length else None
    order = [i for indices in qa_training_batches(windows, args, 0) for i in indices]
    needed = (QA_COMPARE_WARMUP + steps) * args.batch_size
    order = (order * (needed // len(order) + 1))[:needed]  # a small set is cycled through
    batches = [qa_batch_of(windows, order[i:i + args.batch_size], pad_to) for i in range(0, needed, args.batch_size)]
    times = {name: [] for name in sides}
    torch.manual_seed(args.seed)
    for number, batch in enumerate(batches):
        names = list(sides) if number % 2 == 0 else list(sides)[::-1]
        for name in names:
            seconds = qa_timed_step(*sides[name], batch)
            if number >= QA_COMPARE_WARMUP:
                times[name].append(seconds)
    result = {name: {"mean_step_seconds": statistics.mean(values), "median_step_seconds": statistics.median(values)}
              for name, values in times.items()}
    result["speedup_minbert_vs_transformers"] = (result["transformers"]["median_step_seconds"]
                                                 / result["minbert"]["median_step_seconds"])
    result["speedup_of_means"] = result["transformers"]["mean_step_seconds"] / result["minbert"]["mean_step_seconds"]
    result["timed_steps"], result["warmup_steps"] = steps, QA_COMPARE_WARMUP
    result["batch_tokens"] = [int(b["input_ids"].numel()) for b in batches[QA_COMPARE_WARMUP:]]
    result["batch_real_tokens"] = [int(b["attention_mask"].sum()) for b in batches[QA_COMPARE_WARMUP:]]
    return result


# -- main ------------------------------------------------------------------------------------------

def qa_settings(args, directory: Path) -> dict:
    import transformers
    return {"pretrained": args.pretrained, "pretrained_dir": str(directory), "data_dir": str(args.data_dir),
            "max_length": args.max_length, "doc_stride": args.doc_stride, "max_answer_tokens": args.max_answer_tokens,
            "n_best": args.n_best, "batch_size": args.batch_size, "eval_batch_size": QA_EVAL_BATCH_SIZE,
            "lr": args.lr, "epochs": args.epochs, "seed": args.seed, "max_train_examples": args.max_train_examples,
            "pad_to_max_length": args.pad_to_max_length, "optimizer": "torch.optim.AdamW, weight_decay 0",
            "schedule": "constant", "precision": "float32", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": platform.machine()}


def qa_peer_main(argv=None) -> int:
    args = qa_peer_arguments(argv)
    directory = resolve_pretrained(args.pretrained)
    tokenizer = BertTokenizer.from_pretrained(directory)
    train_windows = qa_load_split(args, "train", tokenizer, args.max_train_examples)
    result = {"settings": qa_settings(args, directory),
              "train_questions": len(train_windows.examples), "train_windows": len(train_windows)}
    if args.compare_steps:
        result["compare_steps"] = qa_compare_steps(args, directory, train_windows, args.compare_steps)
        c = result["compare_steps"]
        print(f"same batches, {args.compare_steps} steps: transformers {c['transformers']['median_step_seconds']:.3f} "
              f"s/step, minBERT {c['minbert']['median_step_seconds']:.3f} s/step, "
              f"speed-up {c['speedup_minbert_vs_transformers']:.2f}x")
    else:
        dev_windows = qa_load_split(args, "dev", tokenizer)
        result.update(dev_questions=len(dev_windows.examples), dev_windows=len(dev_windows))
        model, info = qa_transformers_model(directory, args.seed)
        result["loading_info"] = info
        result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        result["train"] = qa_train(model, train_windows, args)
        result["dev"] = qa_evaluate(model, dev_windows, args)
        t, d = result["train"], result["dev"]
        print(f"transformers peer: {result['train_windows']} train windows, {t['steps']} steps, "
              f"{t['step_seconds']:.3f} s/step (mean after {QA_SKIPPED_STEPS}), train {t['train_seconds']:.0f} s, "
              f"{torch.get_num_threads()} thread(s); dev F1 {d['tuned']['f1']:.4f} EM {d['tuned']['em']:.4f} "
              f"(tau {d['tuned']['tau']:.3f}), at tau 0 F1 {d['tau0']['f1']:.4f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0



BENCHMARKS = {"encoder": bench_encoder, "precision": bench_precision, "smart": bench_smart, "memory": bench_memory,
              "pipeline": bench_pipeline, "adapters": bench_adapters, "checkpointing": bench_checkpointing,
              "data_parallel": bench_data_parallel, "ensemble": bench_ensemble}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with --precision resolved for --device: args.precision is bf16, fp16 or fp32 and
    args.requested_precision what was asked (auto, or --bf16 / --no-bf16 through their alias)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--config", default="minilm-l6", help="minilm-l6, a checkpoint, or random weights: "
                        "bert-base-random, random:NAME_OR_CONFIG_JSON")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto: as training resolves it for the device (runtime.resolve_precision)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="alias: --bf16 is --precision bf16, --no-bf16 is --precision fp32")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data" / "protocol"),
                        help="for the pipeline benchmark (needs ids-sst-train.csv)")
    parser.add_argument("--json", type=Path, help="also append the results to this JSON-lines file")
    args = parser.parse_args(argv)
    try:
        args.requested_precision = requested_precision(args.precision, args.bf16)
    except ValueError as err:
        parser.error(str(err))
    args.precision = resolve_precision(torch.device(args.device), args.requested_precision)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["qa_peer"]:  # a training run with its own flags, not a timed kind
        return qa_peer_main(argv[1:])
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    use_tf32(device)  # as training does: float32 matmuls through TF32 on CUDA
    names = list(BENCHMARKS) if args.which == "all" else [args.which]
    for name in names:
        GRADIENT_SCALING.clear()
        result = BENCHMARKS[name](args, device)
        if GRADIENT_SCALING:
            result["fp16_skipped_steps"] = sum(record["skipped"] for record in GRADIENT_SCALING)
        result["setup"] = describe(args, device)
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
