"""qqp_epoch: one QQP SMART epoch of the course's pairs, from real training steps timed back to back.
"""
from __future__ import annotations

import itertools
import math
import tempfile
import time
from pathlib import Path

from minbert.benchmarks.models import random_config, synchronize
from minbert.benchmarks.recipe_trainer import audit_trainer, random_checkpoint
from minbert.benchmarks.settings import BenchmarkSettings
from minbert.benchmarks.timing import PEAK_TFLOPS, peak_flops


COURSE_QQP_TRAIN_PAIRS = 141_506  # the handout's quora-train.csv (seed 001)
THESIS_SMART_QQP_EPOCH_HOURS = 5.0  # the thesis' SMART QQP epoch on a Colab L4, at batch 8 (seed 000)


def bench_qqp_epoch(settings: BenchmarkSettings, device) -> dict:
    """One QQP SMART epoch of the course's 141,506 pairs at --batch_size, as the SS recipe trains it (gpu_ss.sh's
    flags on CUDA, cpu_ss.sh's on the CPU, with --config's model and --seq_len as --max_length): after --warmup
    steps, --steps x --rounds real QQP steps of --data_dir's train file (batches as the stage draws them, length
    buckets on CUDA) run back to back, the device synchronised only before and after, as training runs them; the
    epoch is that step time x the epoch's steps. On a GPU with a known peak, the L4 time it implies scales the
    epoch by the two cards' published peaks in the run's precision (an estimate, labelled so)."""
    with tempfile.TemporaryDirectory() as folder:
        config = random_config(settings.config)
        pretrained = settings.config if config is None else str(random_checkpoint(config, Path(folder) / "model"))
        trainer, _ = audit_trainer(settings, device, True, pretrained, folder)
        loader = trainer.stage_data.train_loader("qqp", trainer.config.seed)
        needed = settings.warmup + settings.steps * settings.rounds
        batches = [batch for _, batch in zip(range(needed), itertools.cycle(loader))]
        measured = batches[settings.warmup:]
        trainer.loop.run_steps(([("qqp", batch)] for batch in batches[:settings.warmup]), settings.warmup, "warm-up")
        synchronize(device)
        start = time.perf_counter()
        trainer.loop.run_steps(([("qqp", batch)] for batch in measured), len(measured), "qqp")
        synchronize(device)
        step_s = (time.perf_counter() - start) / (needed - settings.warmup)
    epoch_steps = math.ceil(COURSE_QQP_TRAIN_PAIRS / settings.batch_size)
    result = {"benchmark": f"one QQP SMART epoch of the course's {COURSE_QQP_TRAIN_PAIRS:,} pairs at batch "
                           f"{settings.batch_size} (measured steps x the epoch's {epoch_steps} steps)",
              "smart_precision": trainer.penalty("smart").regularizers["qqp"].config.precision,
              "timed_steps": needed - settings.warmup, "step_s": round(step_s, 5), "epoch_steps": epoch_steps,
              "epoch_hours": round(step_s * epoch_steps / 3600, 3),
              "thesis_l4_epoch_hours_at_batch_8": THESIS_SMART_QQP_EPOCH_HOURS}
    here, _ = peak_flops(device, settings.precision, settings.threads)
    l4 = dict(PEAK_TFLOPS)["L4"].get(settings.precision)
    if device.type == "cuda" and here is not None and l4 is not None:
        result["implied_l4_epoch_hours_estimate"] = round(result["epoch_hours"] * here / (l4 * 1e12), 2)
    return result
