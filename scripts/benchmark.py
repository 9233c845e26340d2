"""Speed and memory benchmarks; every figure is a ratio or a number measured in this one run.

    python scripts/benchmark.py encoder    # minBERT vs transformers.BertModel train step (same weights, batch)
    python scripts/benchmark.py precision  # minBERT train step: float32 vs bf16 autocast (--bf16 is ignored)
    python scripts/benchmark.py smart      # SMART step vs plain step, and peak memory with and without SMART
    python scripts/benchmark.py adapters   # full fine-tuning vs LoRA / DoRA / PALs: parameters, size, time, memory
    python scripts/benchmark.py checkpointing  # train step with and without gradient checkpointing
    python scripts/benchmark.py pipeline   # tokens/s of the full training pipeline (tokenize, collate, step)
    python scripts/benchmark.py data_parallel  # 1 process vs 2 gloo processes (distributed.py), same global batch
    python scripts/benchmark.py ensemble   # one model's inference on dev + test vs combining 5 runs' saved scores
    python scripts/benchmark.py all

Defaults: minilm-l6, batch 32 x 64 tokens, 2 CPU threads; `--device cuda` adds bf16 autocast (`--bf16` on CPU), and
`--config bert-base-random` uses a randomly initialised bert-base-sized model (no download needed).
The two sides of a comparison alternate, round after round, so drift in machine load hits both.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from base_bert import BertConfig, resolve_pretrained  # noqa: E402
from bert import BertModel  # noqa: E402
from runtime import bf16_autocast, bf16_enabled, cpu_has_native_bf16  # noqa: E402
from optimizer import AdamW  # noqa: E402


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_batch(batch_size: int, seq_len: int, vocab_size: int, device: torch.device, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=generator)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size,), generator=generator)
    lengths[0] = seq_len
    mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


def build_minbert(args) -> BertModel:
    """minBERT alone for --config: random bert-base, random weights in a checkpoint's shape ("random:NAME",
    for the memory probe), or pretrained."""
    torch.manual_seed(0)
    if args.config == "bert-base-random":
        return BertModel(BertConfig())
    if args.config.startswith("random:"):
        return BertModel(BertConfig.from_json_file(resolve_pretrained(args.config[7:]) / "config.json"))
    return BertModel.from_pretrained(args.config)


def build_encoders(args, device):
    """minBERT and transformers.BertModel holding identical weights."""
    from transformers import BertConfig as HFConfig, BertModel as HFBertModel
    if args.config == "bert-base-random":
        torch.manual_seed(0)
        ours = BertModel(BertConfig())
        reference = HFBertModel(HFConfig(attn_implementation="sdpa"))
        from base_bert import convert_hf_state_dict
        ours.load_state_dict(convert_hf_state_dict(reference.state_dict(), ours.config.num_hidden_layers))
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


def train_step_fn(model, optimizer, ids, mask, device, bf16: bool | None, hf: bool):
    def step():
        optimizer.zero_grad(set_to_none=True)
        with bf16_autocast(device, bf16):
            if hf:
                out = model(input_ids=ids, attention_mask=mask)
                hidden, pooled = out.last_hidden_state, out.pooler_output
            else:
                out = model(ids, mask)
                hidden, pooled = out["last_hidden_state"], out["pooler_output"]
            loss = hidden.float().pow(2).mean() + pooled.float().pow(2).mean()
        loss.backward()
        optimizer.step()
    return step


def bench_encoder(args, device) -> dict:
    ours, reference = build_encoders(args, device)
    ids, mask = make_batch(args.batch_size, args.seq_len, ours.config.vocab_size, device)
    steps = {
        "minbert": train_step_fn(ours, AdamW(ours.parameters(), lr=1e-5), ids, mask, device, args.bf16, hf=False),
        "transformers": train_step_fn(reference, AdamW(reference.parameters(), lr=1e-5), ids, mask, device, args.bf16,
                                      hf=True),
    }
    medians = alternate(steps, args, device)
    return {
        "benchmark": "encoder train step (forward, backward, AdamW)",
        "median_step_s": medians,
        "speedup_minbert_vs_transformers": medians["transformers"] / medians["minbert"],
    }


def bench_precision(args, device) -> dict:
    """minBERT train step in float32 against the same step under bf16 autocast (same weights, batch)."""
    ours = build_minbert(args).to(device).train()
    ids, mask = make_batch(args.batch_size, args.seq_len, ours.config.vocab_size, device)
    optimizer = AdamW(ours.parameters(), lr=1e-5)
    steps = {"float32": train_step_fn(ours, optimizer, ids, mask, device, False, hf=False),
             "bf16_autocast": train_step_fn(ours, optimizer, ids, mask, device, True, hf=False)}
    medians = alternate(steps, args, device)
    return {
        "benchmark": "minBERT train step, float32 vs bf16 autocast",
        "median_step_s": medians,
        "speedup_bf16_vs_float32": medians["float32"] / medians["bf16_autocast"],
    }


def describe(args, device) -> dict:
    info = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
            "config": args.config, "batch": f"{args.batch_size}x{args.seq_len}",
            "python": platform.python_version(), "machine": platform.machine()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    else:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["native_bf16"] = cpu_has_native_bf16()
    info["autocast"] = "bf16" if bf16_enabled(device, args.bf16) else "off"
    return info


def multitask_setup(args, device, smart: bool, adapter: str | None = None, checkpointing: bool = False):
    """A MultitaskBERT with its optimizer and (optionally) SMART on one fixed STS-like pair batch; with an
    adapter kind, per-task adapters of rank 8 over a frozen encoder."""
    from adapters import AdapterConfig
    from multitask_bert import MultitaskBERT, freeze_encoder
    from smart import SmartConfig, SmartRegularizer
    bert = build_minbert(args)
    model = MultitaskBERT(bert, adapter=AdapterConfig(adapter) if adapter else None)
    if adapter:
        freeze_encoder(model)
    model.bert.encoder.gradient_checkpointing = checkpointing
    model = model.to(device).train()
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig()) if smart else None
    ids_1, mask_1 = make_batch(args.batch_size, args.seq_len, bert.config.vocab_size, device, seed=1)
    ids_2, mask_2 = make_batch(args.batch_size, args.seq_len, bert.config.vocab_size, device, seed=2)
    batch = {"input_ids_1": ids_1, "attention_mask_1": mask_1, "input_ids_2": ids_2, "attention_mask_2": mask_2,
             "labels": torch.rand(args.batch_size, device=device) * 5}
    return model, optimizer, regularizer, batch


def multitask_step_fn(model, optimizer, regularizer, batch, device, bf16: bool | None, task="qqp"):
    from trainer import compute_task_loss
    if task == "qqp":
        batch = {**batch, "labels": (batch["labels"] > 2.5).float()}

    def step():
        optimizer.zero_grad(set_to_none=True)
        with bf16_autocast(device, bf16):
            loss = compute_task_loss(model, task, batch, regularizer)
        loss.backward()
        optimizer.step()
        if regularizer is not None:
            regularizer.teacher.update(model)
    return step


def _memory_status(field: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS: resident now, VmHWM: peak resident)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _peak_memory_worker(args, device, smart, adapter, checkpointing, queue):
    if device.type == "cpu":
        # Random weights of the same shape: loading a checkpoint would set a higher-water mark than a step.
        args = argparse.Namespace(**{**vars(args), "config": "random:" + args.config})
    model, optimizer, regularizer, batch = multitask_setup(args, device, smart, adapter, checkpointing)
    small = {k: v[:1, :8] if v.dim() == 2 else v[:1] for k, v in batch.items()}
    multitask_step_fn(model, optimizer, regularizer, small, device, args.bf16)()  # optimizer state now exists
    # Without the gradients of that step: every step frees them first (set_to_none) and makes them anew, so
    # they belong to the step's memory, not the base (else full fine-tuning's 87 MiB of them go uncounted).
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current size
        base = _memory_status("VmRSS")
    step = multitask_step_fn(model, optimizer, regularizer, batch, device, args.bf16)
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
    value = queue.get()
    process.join()
    return value


def smart_phase_fns(model, regularizer, batch, device, bf16: bool | None, task="qqp") -> dict:
    """The passes of a SMART step, each as a function timed on its own (forwards include the clean one
    they need): where a SMART step's time goes."""
    from smart import find_perturbation
    batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
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

    def with_amp(fn):
        def run():
            model.zero_grad(set_to_none=True)
            with bf16_autocast(device, bf16):
                fn()
        return run
    return {
        "clean forward": with_amp(clean),
        "clean forward + backward": with_amp(lambda: objective.loss(clean()[0], batch["labels"]).backward()),
        "clean forward + ascent step": with_amp(ascent),
        "clean forward + perturbed forward": with_amp(lambda: forward_fn(clean()[1])),
        "teacher forward": with_amp(lambda: regularizer.teacher(model, task, batch)),
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
    project's SMART functions (one ascent step, gradient to the perturbation only, teacher without gradient)."""
    import torch.nn.functional as F

    from smart import SmartConfig, SmartRegularizer
    _, reference = build_encoders(args, device)
    model = TransformersSbertQQP(reference).to(device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig()) if smart else None
    (ids_1, mask_1), (ids_2, mask_2) = (make_batch(args.batch_size, args.seq_len, reference.config.vocab_size,
                                                   device, seed=seed) for seed in (1, 2))
    ids, mask = torch.cat([ids_1, ids_2]), torch.cat([mask_1, mask_2])  # (2B, T): both sides in one pass
    labels = (torch.rand(args.batch_size, device=device) > 0.5).float()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with bf16_autocast(device, args.bf16):
            embeddings = (model.bert.embeddings.word_embeddings(ids),)

            def forward_fn(e):
                return model.outputs_from_word_embeddings(e[0], mask)
            logits = forward_fn(embeddings)
            loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
            if regularizer is not None:
                loss = loss + regularizer.penalty(forward_fn, embeddings, logits, "bernoulli", teacher_args=(ids, mask))
        loss.backward()
        optimizer.step()
        if regularizer is not None:
            regularizer.teacher.update(model)
    return step


def bench_smart(args, device) -> dict:
    """SMART step (clean forward, 1 ascent step, perturbed forward, teacher forward) vs a plain step, here
    and with the same SMART functions around transformers.BertModel (its ratio is the issue's yardstick)."""
    steps = {}
    for name, smart in (("plain", False), ("smart", True)):
        model, optimizer, regularizer, batch = multitask_setup(args, device, smart)
        steps[name] = multitask_step_fn(model, optimizer, regularizer, batch, device, args.bf16)
        steps[f"transformers_{name}"] = transformers_step_fn(args, device, smart)
    medians = alternate(steps, args, device)
    phases = alternate(smart_phase_fns(model, regularizer, batch, device, args.bf16), args, device)
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
    from tokenizer import BertTokenizer
    from trainer import compute_task_loss
    data = Path(args.data_dir) / "ids-sst-train.csv"
    examples = load_sentence_examples(data, "sst", "train")
    tokenizer = BertTokenizer.from_pretrained(args.config)
    model = MultitaskBERT(BertModel.from_pretrained(args.config)).to(device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5)
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
        with bf16_autocast(device, args.bf16):
            loss = compute_task_loss(model, "sst", batch)
        loss.backward()
        optimizer.step()
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
        steps[name] = multitask_step_fn(model, optimizer, None, batch, device, args.bf16)
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
        steps[name] = multitask_step_fn(model, optimizer, None, batch, device, args.bf16)
    medians = alternate(steps, args, device)
    memory = {name: peak_step_memory(args, device, False, checkpointing=name == "checkpointed") for name in steps}
    return {"benchmark": "QQP SBERT train step with and without gradient checkpointing",
            "median_step_s": medians, "checkpointing_time_ratio": medians["checkpointed"] / medians["plain"],
            "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()},
            "checkpointing_memory_ratio": memory["checkpointed"] / max(memory["plain"], 1)}


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
    model, optimizer, _, batch = multitask_setup(local, torch.device("cpu"), False)
    batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
    step_times, reduce_times = [], []
    for index in range(args.warmup + args.steps * args.rounds):
        distributed.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with bf16_autocast(torch.device("cpu"), args.bf16):
            loss = compute_task_loss(model, "qqp", batch)
        loss.backward()
        reduce_start = time.perf_counter()
        distributed.average_gradients(model.parameters())
        reduce_end = time.perf_counter()
        optimizer.step()
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
    (ensemble.combine); the members' own inference is paid once, at the end of their runs."""
    import numpy as np
    from datasets import load_split
    from ensemble import combine
    from multitask_bert import MultitaskBERT
    from tasks import MULTITASK
    from tokenizer import BertTokenizer
    from trainer import predict_examples
    model = MultitaskBERT(BertModel.from_pretrained(args.config)).to(device).eval()
    tokenizer = BertTokenizer.from_pretrained(args.config)
    splits = {(t, s): load_split(args.data_dir, t, s) for t in MULTITASK for s in ("dev", "test")}
    seconds = {}
    for (task, split), examples in splits.items():
        synchronize(device)
        start = time.perf_counter()
        predict_examples(model, task, examples, tokenizer, device, 64, args.seq_len, args.bf16, scores=True)
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


BENCHMARKS = {"encoder": bench_encoder, "precision": bench_precision, "smart": bench_smart,
              "pipeline": bench_pipeline, "adapters": bench_adapters, "checkpointing": bench_checkpointing,
              "data_parallel": bench_data_parallel, "ensemble": bench_ensemble}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--config", default="minilm-l6", help="minilm-l6, a checkpoint, or bert-base-random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="bf16 autocast (default: on for CUDA, off for CPU)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data" / "protocol"),
                        help="for the pipeline benchmark (needs ids-sst-train.csv)")
    parser.add_argument("--json", type=Path, help="also append the results to this JSON-lines file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    names = list(BENCHMARKS) if args.which == "all" else [args.which]
    for name in names:
        result = {**BENCHMARKS[name](args, device), "setup": describe(args, device)}
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
