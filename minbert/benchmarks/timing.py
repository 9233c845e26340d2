"""Timing training steps: the sides of a comparison alternating round after round, the steps as training takes them
(an fp16 update through a gradient scaler), and the model FLOPs utilisation beside each step time.
"""
from __future__ import annotations

import functools
import statistics
import time

import numpy as np
import torch

from base_bert import BertConfig
from minbert.benchmarks.models import synchronize
from minbert.benchmarks.settings import BenchmarkSettings
from minbert.runtime import autocast, scaled_step
from minbert.tasks import TASKS


def timed_steps(step, steps: int, device) -> list[float]:
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def alternate(steps: dict, settings: BenchmarkSettings, device) -> dict[str, float]:
    """Median step time of each named step function, the sides alternating round after round."""
    for step in steps.values():  # warm-up: allocator, kernels, autotuning
        timed_steps(step, settings.warmup, device)
    samples = {name: [] for name in steps}
    for _ in range(settings.rounds):
        for name, step in steps.items():
            samples[name] += timed_steps(step, settings.steps, device)
    return {name: statistics.median(values) for name, values in samples.items()}


# Published dense peaks (no sparsity), TFLOP/s, by the precision a step's matmuls run in (fp32 on CUDA: TF32,
# runtime.use_tf32). Names are matched in order against torch.cuda.get_device_name.
PEAK_TFLOPS = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 378.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),  # no TF32 and no bf16 tensor cores
)


def train_flops(config: BertConfig, lengths) -> float:
    """The useful matmul FLOPs of one training step (forward and backward: 3 x the forward's) on rows of these
    real lengths: 2 x 3 x the layers' weights (and the pooler's) per real token, and each sequence's attention
    scores and weighted values, 2 x 2 x hidden x length^2 per layer, x 3. Padding counts for nothing."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    weights = layers * (4 * hidden * hidden + 2 * hidden * config.intermediate_size) + hidden * hidden
    lengths = np.asarray(lengths, dtype=np.float64)
    return float(6 * weights * lengths.sum() + 12 * layers * hidden * (lengths ** 2).sum())


def peak_flops(device: torch.device, precision: str, threads: int) -> tuple[float | None, str]:
    """(FLOP/s, where the figure comes from): a known GPU's published dense peak in `precision`, or on a CPU the
    dense matmul throughput measured here with these threads; (None, why) when neither is known."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for pattern, peaks in PEAK_TFLOPS:
            if pattern in name and precision in peaks:
                return peaks[precision] * 1e12, f"published dense peak of the {pattern} in {precision}"
        return None, f"no published peak known for {name} in {precision}"
    if precision == "fp16":  # emulated on CPUs: no peak to speak of, and slow to measure
        return None, "fp16 is emulated on CPUs"
    return measured_matmul_flops(precision, threads), (f"this CPU's measured {CPU_MATMUL_SIZE}^3 matmul in "
                                                       f"{precision}, {threads} threads")


CPU_MATMUL_SIZE = 1024


@functools.lru_cache(maxsize=None)
def measured_matmul_flops(precision: str, threads: int) -> float:
    """The CPU's dense matmul FLOP/s in `precision` (bf16 operands, as autocast casts them) with `threads` threads
    (the benchmark's own setting): the best of a few runs, measured once per run."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(CPU_MATMUL_SIZE, CPU_MATMUL_SIZE).to(dtype) for _ in range(2))
    a @ b  # warm-up
    best = min(timed_steps(lambda: a @ b, 3, torch.device("cpu")))
    return 2 * CPU_MATMUL_SIZE ** 3 / best


def significant(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def utilisation(medians: dict[str, float], precisions: dict[str, str], config: BertConfig, lengths, device,
                settings) -> dict:
    """TFLOP/s and model FLOPs utilisation of timed training steps (each on rows of `lengths`, computing in its
    precision), for the results beside their times."""
    flops = train_flops(config, lengths)
    result = {"train_step_tflop": significant(flops / 1e12), "achieved_tflops": {}, "mfu": {}, "mfu_peak": {}}
    for name, seconds in medians.items():
        peak, source = peak_flops(device, precisions[name], settings.threads)
        result["achieved_tflops"][name] = significant(flops / seconds / 1e12)
        result["mfu"][name] = None if peak is None else significant(flops / seconds / peak)
        result["mfu_peak"][name] = source
    return result


GRADIENT_SCALING: list[dict] = []  # {"skipped": n} of this benchmark's fp16 updates (not the updates: no
# reference to their optimizers and models)


class Update:
    """The backward pass and optimizer step of a training step as minbert/training/loop.py takes them at
    `precision`: with fp16 through a torch.amp.GradScaler (the loss scaled before backward; scaler.step skips the
    step when a gradient is inf or NaN and scaler.update then lowers the scale). No clipping here, so no unscale_
    before the step."""

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


def train_step_fn(model, optimizer, ids, mask, device, precision: str, hf: bool, lengths=None):
    """A train step of an encoder alone (loss: the mean square of its outputs); minBERT's layout is built each step
    from the rows' host `lengths`, as MultitaskBERT.encoder_inputs builds it from a collated batch."""
    update = Update(optimizer, device, precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            if hf:
                out = model(input_ids=ids, attention_mask=mask)
                hidden, pooled = out.last_hidden_state, out.pooler_output
            else:
                hidden = model.encode(model.embed(ids), mask, model.encoder.layout(mask, lengths))
                pooled = model.pooler(hidden)
            loss = hidden.float().pow(2).mean() + pooled.float().pow(2).mean()
        update(loss)
    return step


def multitask_step_fn(model, optimizer, regularizer, batch, device, precision: str, task="qqp"):
    """One training step as the trainer takes it: with SMART at precision exact, compute_task_loss runs the whole loss
    in float32 whatever the autocast around it."""
    from minbert.training.objective import compute_task_loss
    from minbert.training.penalties.smart import SmartPenalty
    penalties = [] if regularizer is None else [SmartPenalty({task: regularizer})]
    if TASKS[task].num_classes == 2:  # two classes on one logit: the 0-5 labels cut at their middle
        batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
    update = Update(optimizer, device, precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss, _ = compute_task_loss(model, task, batch, penalties)
        if update(loss) and regularizer is not None:
            regularizer.anchor.update(model)
    return step
