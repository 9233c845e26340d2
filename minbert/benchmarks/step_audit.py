"""step_audit: what one plain and one SMART training step make the host wait for, every operator they dispatch (the
weights' dtype casts among them; under bf16 the plain step again with --bf16_weights, which should cast none), and
where torch.compile breaks the plain step's graph (its forward, its loss, and the whole step as --capture_step
compiles it, the backward and the optimizer's update included); no timing.
"""
from __future__ import annotations

import gc
import tempfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

from minbert.benchmarks.host_syncs import StepCount, counting, project_frame
from minbert.benchmarks.models import random_config
from minbert.benchmarks.recipe_trainer import audit_trainer, audit_training_argv, random_checkpoint
from minbert.benchmarks.settings import BenchmarkSettings
from minbert.run.training_args import UsageError
from minbert.runtime import to_device


def first_training_batches(trainer, stages, settings: BenchmarkSettings) -> tuple[str, list[dict]]:
    """The task of the run's first task stage and its first two batches, from the loader that run_stage makes (its
    seed included): one to warm up on and the one to count."""
    from minbert.training.schedules import StageKind
    index, stage = next((i, s) for i, s in enumerate(stages) if s.kind is StageKind.TASK)
    stage_data = trainer.stage_data
    loader = stage_data.train_loader(stage.task, trainer.config.seed + 1000 * index, stage_data.stage_size(stage))
    batches = [batch for _, batch in zip(range(2), loader)]
    if len(batches) < 2:
        raise UsageError(f"--batch_size {settings.batch_size}: {settings.data_dir}'s {stage.task} training set makes "
                         "fewer than the two batches step_audit needs (a warm-up step, then the counted one)")
    return stage.task, batches


def audited_step(trainer, task: str, warm_up: dict, counted: dict) -> StepCount:
    """One training step as run_steps takes it (the forward, the loss and its penalties, the backward, the update),
    counted after an uncounted one on `warm_up` (the optimizer's state, SMART's anchor), inside a stage of three
    steps that never reaches its end: the losses, on the device, are read by the loop once per log line. Its weight
    casts are the dtype conversions of the model's parameters (or of views of them)."""
    counts = []

    def steps():
        yield [(task, warm_up)]
        with counting(trainer.device, trainer.model.parameters()) as count:
            yield [(task, counted)]  # counted until the loop asks for the next step: its update done
        counts.append(count)
    trainer.loop.run_steps(steps(), 3, "audit")
    return counts[0]


def graph_breaks(function) -> dict:
    """The graph breaks torch.compile meets in function(): torch._dynamo.explain's count (with default settings: the
    graphs it made, less one, resumed frames' included) and the reasons it recorded, by project line."""
    import torch._dynamo
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(function)()
    torch._dynamo.reset()
    reasons = Counter((reason.reason.splitlines()[0][:160], project_frame(reason.user_stack) or "torch")
                      for reason in explanation.break_reasons)
    return {"count": explanation.graph_break_count,
            "reasons": [{"reason": reason, "where": where, "times": times}
                        for (reason, where), times in reasons.most_common()]}


@contextmanager
def inputs_prepared(model, inputs):
    """model.encoder_inputs() returns `inputs` inside the block: the host-side preparation (the token layout from
    the rows' host lengths, numpy's) done beforehand, out of what torch._dynamo traces."""
    model.encoder_inputs = lambda task, batch: inputs  # an instance attribute, over the method
    try:
        yield
    finally:
        del model.encoder_inputs


def plain_step_graph_breaks(trainer, task: str, batch: dict) -> dict:
    """Graph breaks in the plain step of the model's forward (embeddings, encoder and head: what torch.compile is
    to capture), of its forward and loss (compute_task_loss under the run's autocast, as task_step runs it), each
    with the inputs and token layout prepared on the host beforehand, and of the step's whole loss computation (the
    host-side preparation included)."""
    from minbert.training.objective import compute_task_loss
    model = trainer.model
    batch = to_device(batch, trainer.device)

    def loss():
        with trainer.parts.amp:
            return compute_task_loss(model, task, batch, trainer.penalties)[0]
    model.set_adapter(task)
    inputs = model.encoder_inputs(task, batch)

    def forward():
        with trainer.parts.amp:
            return model.outputs_from_embeddings(task, model.embed(inputs), inputs)
    with inputs_prepared(model, inputs):
        forward_and_loss = graph_breaks(loss)
    return {"model forward": graph_breaks(forward), "forward and loss": forward_and_loss,
            "loss computation": graph_breaks(loss)}


def whole_step_graph_breaks(trainer, task: str, batch: dict) -> dict:
    """Graph breaks in the plain step whole, as --capture_step compiles it (captured_step.CapturedStep.step): the
    forward, the loss, the backward, the clipping and AdamW's update, on the padded layout, with the host's part
    (layout, learning rate) done beforehand as the captured step does it. It takes the step: the trainer's last use."""
    from minbert.training.captured_step import CapturedStep, capturing
    encoder = trainer.model.bert.encoder
    packed, encoder.pack_tokens = encoder.pack_tokens, False
    try:
        captured = CapturedStep(trainer.model, trainer.optimizer, trainer.parts.amp, trainer.config.max_grad_norm)
        arguments = captured.prepare(trainer.loop.objective(task), to_device(batch, trainer.device), trainer.config.lr)
        with capturing():
            return graph_breaks(lambda: captured.step(*arguments))
    finally:
        encoder.pack_tokens = packed


def step_figures(count: StepCount, task: str, batch: dict, argv: list[str], precision: str) -> dict:
    return {"task": task, "batch_shapes": {k: list(v.shape) for k, v in batch.items() if torch.is_tensor(v)},
            "training_argv": argv, "precision": precision, "host_syncs": count.host_syncs, "ops": count.ops,
            "views": count.views, "weight_casts": count.weight_casts,
            "host_syncs_by_site": [{"what": what, "where": where, "times": times}
                                   for (what, where), times in count.syncs.most_common()],
            "operators": dict(count.operators.most_common())}


# The steps the audit counts, by result key: (SMART, --bf16_weights).
AUDITED_STEPS = {"plain_step": (False, False), "smart_step": (True, False), "plain_step_bf16_weights": (False, True)}


def bench_step_audit(settings: BenchmarkSettings, device) -> dict:
    """One plain and one SMART training step as the command line trains them (under bf16 also the plain step with
    --bf16_weights), each counted after a warm-up step: the host syncs (what and where), every aten operator
    dispatched (the backward pass and the optimizer step included), the weight casts among them and, for the plain
    step, the graph breaks that torch.compile meets in the model's forward (and in its forward and loss, and the
    whole loss computation, reported beside it). The plain step with --bf16_weights only where the plain step's
    run is bf16 (the option keeps the weights that bf16 autocast reads)."""
    result = {"benchmark": "step_audit: host syncs, aten operators and graph breaks of one training step"}
    with tempfile.TemporaryDirectory() as folder:
        config = random_config(settings.config)
        pretrained = settings.config if config is None else str(random_checkpoint(config, Path(folder) / "model"))
        for key, (smart, bf16_weights) in AUDITED_STEPS.items():
            if bf16_weights and result["plain_step"]["precision"] != "bf16":
                continue
            trainer, stages = audit_trainer(settings, device, smart, pretrained, folder, bf16_weights)
            task, (warm_up, counted) = first_training_batches(trainer, stages, settings)
            count = audited_step(trainer, task, warm_up, counted)
            argv = audit_training_argv(settings, smart, settings.config, "OUTPUT_DIR", bf16_weights)
            result[key] = step_figures(count, task, counted, argv, trainer.config.precision)
            if key == "plain_step":
                breaks = plain_step_graph_breaks(trainer, task, counted)
                result["plain_step"].update(
                    graph_breaks=breaks["model forward"]["count"],
                    graph_break_reasons=breaks["model forward"]["reasons"],
                    graph_breaks_forward_and_loss=breaks["forward and loss"]["count"],
                    graph_break_reasons_forward_and_loss=breaks["forward and loss"]["reasons"],
                    graph_breaks_loss_computation=breaks["loss computation"]["count"],
                    graph_break_reasons_loss_computation=breaks["loss computation"]["reasons"])
            if key in ("plain_step", "smart_step"):  # the two steps --capture_step captures
                whole = whole_step_graph_breaks(trainer, task, counted)
                result[key].update(graph_breaks_whole_step=whole["count"],
                                   graph_break_reasons_whole_step=whole["reasons"])
            del trainer
            gc.collect()
    return result


def step_audit_lines(result: dict) -> list[str]:
    """What the audit prints after its JSON: every host sync by site, the graph breaks, the plain step with
    --bf16_weights, then the two summary lines."""
    plain, smart = result["plain_step"], result["smart_step"]
    lines = [f"{name} step sync: {site['times']} x {site['what']} at {site['where']}"
             for name, step in (("plain", plain), ("smart", smart)) for site in step["host_syncs_by_site"]]
    lines.append(f"graph breaks (torch._dynamo.explain: graphs - 1): the model's forward {plain['graph_breaks']}, "
                 f"its forward and loss {plain['graph_breaks_forward_and_loss']}, the plain step's whole loss "
                 f"computation (the host-side layout included) {plain['graph_breaks_loss_computation']}, the whole "
                 f"step as --capture_step compiles it (backward and AdamW's update included) "
                 f"{plain['graph_breaks_whole_step']}")
    for part, key in (("forward", "graph_break_reasons"), ("forward and loss", "graph_break_reasons_forward_and_loss"),
                      ("loss computation", "graph_break_reasons_loss_computation"),
                      ("whole step", "graph_break_reasons_whole_step")):
        lines += [f"graph break in the {part}: {r['times']} x {r['reason']} at {r['where']}" for r in plain[key]]
    copies = result.get("plain_step_bf16_weights")
    lines.append("plain step with --bf16_weights: " + (
        f"host syncs {copies['host_syncs']}, ops {copies['ops']} (views {copies['views']}), "
        f"weight casts {copies['weight_casts']}" if copies
        else f"not counted (the option needs bf16 autocast; the plain step's precision is {plain['precision']})"))
    lines.append(f"plain step: host syncs {plain['host_syncs']}, ops {plain['ops']} (views {plain['views']}), "
                 f"weight casts {plain['weight_casts']}, graph breaks {plain['graph_breaks']}")
    lines += [f"graph break in the SMART step whole: {r['times']} x {r['reason']} at {r['where']}"
              for r in smart["graph_break_reasons_whole_step"]]
    lines.append(f"smart step: host syncs {smart['host_syncs']}, ops {smart['ops']} (views {smart['views']}), "
                 f"weight casts {smart['weight_casts']}, graph breaks of the whole step as --capture_step compiles "
                 f"it {smart['graph_breaks_whole_step']}")
    return lines
