"""Train-step comparisons: minBERT against transformers.BertModel (`encoder`), float32 against 16-bit autocast
(`precision`), SMART against a plain step and where its time goes (`smart`), full fine-tuning against adapters
(`adapters`), gradient checkpointing (`checkpointing`), and the whole step captured as one graph against the eager
step (`captured_step`).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bert import BertModel
from minbert.benchmarks.memory import LiveTensorBytes, attention_operators, peak_step_memory
from minbert.benchmarks.models import build_encoders, build_minbert, make_batch, multitask_setup, place
from minbert.benchmarks.settings import BenchmarkSettings, sixteen_bit
from minbert.benchmarks.timing import Update, alternate, multitask_step_fn, train_step_fn, utilisation
from minbert.data.batches import row_lengths
from minbert.runtime import autocast, float32_exact
from minbert.training.captured_step import CapturedStep, capture_backend
from minbert.training.objective import TaskObjective, UpdatePlace
from minbert.training.optimization import build_optimizer, update_weights
from minbert.training.penalties.smart import SmartPenalty
from minbert.training.precision import keep_bf16_copies
from optimizer import AdamW


def attention_kernel(model: BertModel, ids, mask, device, precision: str) -> str:
    """Which kernel scaled_dot_product_attention picks for minBERT's attention in a training forward (its mask
    and dropout included)."""
    # The probe watches eager operators: compiled layers (BertEncoder.compile_layers' instance attribute) run as a
    # graph a dispatch mode cannot enter, so the class's eager method stands in meanwhile; SDPA picks the same kernel.
    compiled = model.encoder.__dict__.pop("run_layers", None)
    try:
        with LiveTensorBytes() as ops, autocast(device, precision):
            model(ids, mask)
    finally:
        if compiled is not None:
            model.encoder.run_layers = compiled
    return attention_operators(ops.names)


def bench_encoder(settings: BenchmarkSettings, device) -> dict:
    """minBERT's train step against transformers.BertModel's (same weights, batch and AdamW); under --compile
    minBERT's layers are compiled and transformers is timed both eager and compiled."""
    ours, reference = build_encoders(settings, device)
    ids, mask = make_batch(settings.batch_size, settings.seq_len, ours.config.vocab_size, device)
    lengths = row_lengths(mask)
    kernel = attention_kernel(ours, ids, mask, device, settings.precision)
    steps = {
        "minbert": train_step_fn(ours, AdamW(ours.parameters(), lr=1e-5), ids, mask, device, settings.precision,
                                 hf=False, lengths=lengths),
        "transformers": train_step_fn(reference, AdamW(reference.parameters(), lr=1e-5), ids, mask, device,
                                      settings.precision, hf=True),
    }
    if settings.compile:
        steps["transformers_compiled"] = train_step_fn(torch.compile(reference), AdamW(reference.parameters(), lr=1e-5),
                                                       ids, mask, device, settings.precision, hf=True)
    medians = alternate(steps, settings, device)
    result = {
        "benchmark": "encoder train step (forward, backward, AdamW)"
                     + (", minBERT compiled" if settings.compile else "")
                     + ("" if settings.compile_mode == "default" else f" ({settings.compile_mode})")
                     + ("" if settings.token_layout == "auto" else f", minBERT's tokens {settings.token_layout}"),
        "median_step_s": medians,
        "speedup_minbert_vs_transformers": medians["transformers"] / medians["minbert"],
        "minbert_attention_kernel": kernel,
        **utilisation(medians, {name: settings.precision for name in medians}, ours.config, lengths, device, settings),
    }
    if settings.compile:
        result["speedup_minbert_vs_transformers_compiled"] = medians["transformers_compiled"] / medians["minbert"]
    return result


def bench_precision(settings: BenchmarkSettings, device) -> dict:
    """minBERT train step in float32 against the same step under 16-bit autocast (same weights, batch); fp16
    steps go through a gradient scaler, as training's do. Under bf16 (not compiled: training refuses
    --bf16_weights with --compile) a third side times the bf16 step with --bf16_weights' copies, which spare
    autocast its cast of every weight each step."""
    half = sixteen_bit(settings, device)
    ours = place(build_minbert(settings), device, settings).train()
    ids, mask = make_batch(settings.batch_size, settings.seq_len, ours.config.vocab_size, device)
    lengths = row_lengths(mask)
    optimizer = AdamW(ours.parameters(), lr=1e-5)
    steps = {"float32": train_step_fn(ours, optimizer, ids, mask, device, "fp32", hf=False, lengths=lengths),
             f"{half}_autocast": train_step_fn(ours, optimizer, ids, mask, device, half, hf=False, lengths=lengths)}
    precisions = {"float32": "fp32", f"{half}_autocast": half}
    if half == "bf16" and not settings.compile:
        copied = place(build_minbert(settings), device, settings).train()
        copied.load_state_dict(ours.state_dict())
        copied_optimizer = AdamW(copied.parameters(), lr=1e-5)
        keep_bf16_copies([copied], copied_optimizer)
        steps["bf16_weights"] = train_step_fn(copied, copied_optimizer, ids, mask, device, "bf16", hf=False,
                                              lengths=lengths)
        precisions["bf16_weights"] = "bf16"
    medians = alternate(steps, settings, device)
    result = {
        "benchmark": f"minBERT train step, float32 vs {half} autocast",
        "sixteen_bit": half,
        "median_step_s": medians,
        "speedup_16bit_vs_float32": medians["float32"] / medians[f"{half}_autocast"],
        **utilisation(medians, precisions, ours.config, lengths, device, settings),
    }
    if "bf16_weights" in medians:
        result["speedup_bf16_weights_vs_casts"] = medians["bf16_autocast"] / medians["bf16_weights"]
    return result


def smart_phase_fns(model, regularizer, batch, device: torch.device, precision: str, task="qqp") -> dict:
    """The passes of a SMART step, each as a function timed on its own (forwards include the clean one
    they need): where a SMART step's time goes. Each runs where the SMART step runs it (compute_task_loss): at
    the run's `precision`, or in exact float32 with SMART's precision exact."""
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
            with float32_exact() if regularizer.config.precision == "exact" else autocast(device, precision):
                fn()
        return run
    return {
        "clean forward": as_in_smart_step(clean),
        "clean forward + backward": as_in_smart_step(lambda: objective.loss(clean()[0], batch["labels"]).backward()),
        "clean forward + ascent step": as_in_smart_step(ascent),
        "clean forward + perturbed forward": as_in_smart_step(lambda: forward_fn(clean()[1])),
        # "teacher": the name the results files and BENCHMARKS.md give SMART's anchor in this phase and its copy
        "teacher forward": as_in_smart_step(lambda: regularizer.anchor(model, task, batch)),
    }


class TransformersSbertQQP(torch.nn.Module):
    """The benchmark's QQP SBERT model on transformers.BertModel: mean pooling, [u, v, |u - v|], linear.
    SMART perturbs its word embeddings (passed as inputs_embeds), as SMART written on transformers does."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert
        self.head = torch.nn.Linear(3 * bert.config.hidden_size, 1)

    def outputs_from_word_embeddings(self, word_embeddings, mask):
        from minbert.model.readout import mean_pool
        hidden = self.bert(inputs_embeds=word_embeddings, attention_mask=mask).last_hidden_state  # (2B, T, H)
        u, v = mean_pool(hidden, mask).chunk(2)  # (B, H) each
        return self.head(torch.cat([u, v, (u - v).abs()], dim=-1)).squeeze(-1)  # (B,)

    def forward(self, ids, mask):
        return self.outputs_from_word_embeddings(self.bert.embeddings.word_embeddings(ids), mask)


def transformers_step_fn(settings: BenchmarkSettings, device, smart: bool):
    """A plain or SMART QQP step of TransformersSbertQQP on the same batch as multitask_setup's, with this
    project's SMART functions (one ascent step, gradient to the perturbation only, the anchor without gradient);
    a SMART step at the run's precision, as compute_task_loss runs this code's by default."""

    from smart import SmartConfig, SmartRegularizer
    _, reference = build_encoders(settings, device)
    model = TransformersSbertQQP(reference).to(device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig()) if smart else None
    (ids_1, mask_1), (ids_2, mask_2) = (make_batch(settings.batch_size, settings.seq_len, reference.config.vocab_size,
                                                   device, seed=seed) for seed in (1, 2))
    ids, mask = torch.cat([ids_1, ids_2]), torch.cat([mask_1, mask_2])  # (2B, T): both sides in one pass
    labels = (torch.rand(settings.batch_size, device=device) > 0.5).float()
    update = Update(optimizer, device, settings.precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, settings.precision):
            embeddings = model.bert.embeddings.word_embeddings(ids)

            def forward_fn(e):
                return model.outputs_from_word_embeddings(e, mask)
            logits = forward_fn(embeddings)
            loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
            if regularizer is not None:
                loss = loss + regularizer.penalty(forward_fn, embeddings, logits, "bernoulli", anchor_args=(ids, mask))
        if update(loss) and regularizer is not None:
            regularizer.anchor.update(model)
    return step


def bench_smart(settings: BenchmarkSettings, device) -> dict:
    """SMART step (clean forward, 1 ascent step, perturbed forward, the anchor's forward) vs a plain step, here
    and with the same SMART functions around transformers.BertModel (its ratio is the issue's yardstick)."""
    steps = {}
    for name, smart in (("plain", False), ("smart", True)):
        model, optimizer, regularizer, batch = multitask_setup(settings, device, smart)
        steps[name] = multitask_step_fn(model, optimizer, regularizer, batch, device, settings.precision)
        steps[f"transformers_{name}"] = transformers_step_fn(settings, device, smart)
    exact = multitask_setup(settings, device, True, smart_precision="exact")  # --smart_precision exact, for the record
    steps["smart_exact"] = multitask_step_fn(*exact, device, settings.precision)
    medians = alternate(steps, settings, device)
    phases = alternate(smart_phase_fns(model, regularizer, batch, device, settings.precision), settings, device)
    memory = {name: peak_step_memory(settings, device, name == "smart") for name in ("plain", "smart")}
    plain_lengths = np.concatenate([batch["lengths_1"], batch["lengths_2"]])
    return {
        "benchmark": "QQP SBERT train step with and without SMART (SMART at the run's precision; smart_exact: "
                     "--smart_precision exact)",
        "median_step_s": medians,
        "smart_cost_ratio": medians["smart"] / medians["plain"],
        "smart_exact_cost_ratio": medians["smart_exact"] / medians["plain"],
        **utilisation({"plain": medians["plain"]}, {"plain": settings.precision}, model.bert.config, plain_lengths,
                      device, settings),
        "transformers_smart_cost_ratio": medians["transformers_smart"] / medians["transformers_plain"],
        "smart_step_speedup_vs_transformers": medians["transformers_smart"] / medians["smart"],
        "smart_phase_s": {name: round(value, 4) for name, value in phases.items()},
        "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()},
        "teacher_copy_mib": round(sum(t.numel() * t.element_size() for t in regularizer.anchor.params.values())
                                  / 2**20, 1),
        "smart_memory_ratio": memory["smart"] / max(memory["plain"], 1),
    }


def bench_adapters(settings: BenchmarkSettings, device) -> dict:
    """Full fine-tuning against per-task LoRA, DoRA (rank 8 on query and value) and PALs over a frozen
    encoder: trainable parameters, checkpoint size, train-step time and peak step memory."""
    import tempfile

    from minbert.model.multitask_bert import save_multitask_model
    kinds = {"full fine-tuning": None, "lora": "lora", "dora": "dora", "pals": "pals"}
    steps, sizes, trainable = {}, {}, {}
    for name, kind in kinds.items():
        model, optimizer, _, batch = multitask_setup(settings, device, False, kind)
        steps[name] = multitask_step_fn(model, optimizer, None, batch, device, settings.precision)
        trainable[name] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        with tempfile.TemporaryDirectory() as folder:
            save_multitask_model(model, Path(folder) / "model", {})
            sizes[name] = (Path(folder) / "model.safetensors").stat().st_size
    medians = alternate(steps, settings, device)
    memory = {name: peak_step_memory(settings, device, False, kind) for name, kind in kinds.items()}
    return {"benchmark": "QQP SBERT train step: full fine-tuning vs per-task adapters over a frozen encoder",
            "trainable_parameters": trainable, "checkpoint_mib": {k: round(v / 2**20, 2) for k, v in sizes.items()},
            "median_step_s": medians, "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()}}


def bench_checkpointing(settings: BenchmarkSettings, device) -> dict:
    """A QQP SBERT train step with and without --gradient_checkpointing: time and peak step memory."""
    steps = {}
    for name, checkpointing in (("plain", False), ("checkpointed", True)):
        model, optimizer, _, batch = multitask_setup(settings, device, False, checkpointing=checkpointing)
        steps[name] = multitask_step_fn(model, optimizer, None, batch, device, settings.precision)
    medians = alternate(steps, settings, device)
    memory = {name: peak_step_memory(settings, device, False, checkpointing=name == "checkpointed") for name in steps}
    return {"benchmark": "QQP SBERT train step with and without gradient checkpointing",
            "median_step_s": medians, "checkpointing_time_ratio": medians["checkpointed"] / medians["plain"],
            "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()},
            "checkpointing_memory_ratio": memory["checkpointed"] / max(memory["plain"], 1)}


# The captured step's benchmark clips as the GPU recipes' SMART runs do (the SMART paper's 1): clipping is in the graph.
CAPTURED_MAX_GRAD_NORM = 1.0


def bench_captured_step(settings: BenchmarkSettings, device) -> dict:
    """The plain and the SMART training step of a task batch (an STS-like pair batch, padded to --seq_len), each
    taken eagerly as the loop takes it (forward, loss and SMART's terms, backward, clipping, the run's AdamW:
    optimization.update_weights, then SMART's anchor update) against the same step captured whole as --capture_step
    runs it (captured_step.CapturedStep: CUDA graphs on CUDA, inductor on the CPU, whose C++ compile takes minutes
    there), on the same model, weights and batch, all on the padded layout the captured step needs (CUDA's
    default). SMART at the paper's settings, its passes at the run's precision. The sides alternate; the captured
    ones compile and record in their warm-up steps (give CUDA graphs --warmup 5 or more)."""
    model, _, regularizer, batch = multitask_setup(settings, device, smart=True)
    model.bert.encoder.pack_tokens = False
    optimizer = build_optimizer(model, 1e-5)  # the run's: each group's rate a device tensor the step reads
    objectives = {"": TaskObjective("sts"), "smart_": TaskObjective("sts", [SmartPenalty({"sts": regularizer},
                                                                                         regularizer.anchor)])}
    amp = autocast(device, settings.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=False)  # fp16 is refused by the flags: no loss scale
    captured = CapturedStep(model, optimizer, amp, CAPTURED_MAX_GRAD_NORM, *capture_backend(device))
    place = UpdatePlace(0, 1, 0, 1)

    def eager(objective):
        with amp:
            loss, _ = objective(model, batch)
        loss.backward()
        update_weights(optimizer, scaler, 1e-5, CAPTURED_MAX_GRAD_NORM)

    def whole(objective):
        captured(objective, batch, 1e-5)

    def then_the_anchor(step, objective):  # SMART's moving average follows each update, outside the graph
        def taken():
            step(objective)
            for penalty in objective.penalties:
                penalty.after_update(model, place)
        return taken
    steps = {f"{prefix}{name}": then_the_anchor(step, objective) for prefix, objective in objectives.items()
             for name, step in (("eager", eager), ("captured", whole))}
    medians = alternate(steps, settings, device)
    return {"benchmark": "plain and SMART train steps (sts pair batch: forward, loss and SMART's terms, backward, "
                         "clipping, AdamW), eager vs captured whole (--capture_step)",
            "capture": list(capture_backend(device)), "median_step_s": medians,
            "speedup_captured_vs_eager": medians["eager"] / medians["captured"],
            "smart_speedup_captured_vs_eager": medians["smart_eager"] / medians["smart_captured"],
            "smart_captured_cost_ratio": medians["smart_captured"] / medians["captured"]}
