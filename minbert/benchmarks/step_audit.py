"""step_audit: what one plain and one SMART training step make the host wait for, every operator they dispatch, and
where torch.compile breaks the plain step's graph; no timing.
"""
from __future__ import annotations

import gc
import tempfile
from collections import Counter
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
    steps that never reaches its end: the losses, on the device, are read by the loop once per log line."""
    counts = []

    def steps():
        yield [(task, warm_up)]
        with counting(trainer.device) as count:
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


def plain_step_graph_breaks(trainer, task: str, batch: dict) -> dict:
    """Graph breaks of the model's forward in the plain step (embeddings, encoder and head: what torch.compile is
    to capture, its inputs and token layout prepared on the host beforehand, as the step prepares them) and of the
    step's whole loss computation (compute_task_loss under the run's autocast, as task_step runs it: the host-side
    preparation included)."""
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
    return {"model forward": graph_breaks(forward), "loss computation": graph_breaks(loss)}


def step_figures(count: StepCount, task: str, batch: dict, argv: list[str]) -> dict:
    return {"task": task, "batch_shapes": {k: list(v.shape) for k, v in batch.items() if torch.is_tensor(v)},
            "training_argv": argv, "host_syncs": count.host_syncs, "ops": count.ops,
            "host_syncs_by_site": [{"what": what, "where": where, "times": times}
                                   for (what, where), times in count.syncs.most_common()],
            "operators": dict(count.operators.most_common())}


def bench_step_audit(settings: BenchmarkSettings, device) -> dict:
    """One plain and one SMART training step as the command line trains them, each counted after a warm-up step:
    the host syncs (what and where), every aten operator dispatched (the backward pass and the optimizer step
    included) and, for the plain step, the graph breaks that torch.compile meets in the model's forward (and in
    the whole loss computation, reported beside it)."""
    result = {"benchmark": "step_audit: host syncs, aten operators and graph breaks of one training step"}
    with tempfile.TemporaryDirectory() as folder:
        config = random_config(settings.config)
        pretrained = settings.config if config is None else str(random_checkpoint(config, Path(folder) / "model"))
        for name, smart in (("plain", False), ("smart", True)):
            trainer, stages = audit_trainer(settings, device, smart, pretrained, folder)
            task, (warm_up, counted) = first_training_batches(trainer, stages, settings)
            count = audited_step(trainer, task, warm_up, counted)
            result[f"{name}_step"] = step_figures(count, task, counted,
                                                  audit_training_argv(settings, smart, settings.config, "OUTPUT_DIR"))
            if not smart:
                breaks = plain_step_graph_breaks(trainer, task, counted)
                result["plain_step"].update(
                    graph_breaks=breaks["model forward"]["count"],
                    graph_break_reasons=breaks["model forward"]["reasons"],
                    graph_breaks_loss_computation=breaks["loss computation"]["count"],
                    graph_break_reasons_loss_computation=breaks["loss computation"]["reasons"])
            del trainer
            gc.collect()
    return result


def step_audit_lines(result: dict) -> list[str]:
    """What the audit prints after its JSON: every host sync by site, the graph breaks, then the two summary lines."""
    plain, smart = result["plain_step"], result["smart_step"]
    lines = [f"{name} step sync: {site['times']} x {site['what']} at {site['where']}"
             for name, step in (("plain", plain), ("smart", smart)) for site in step["host_syncs_by_site"]]
    lines.append(f"graph breaks (torch._dynamo.explain: graphs - 1): the model's forward {plain['graph_breaks']}, "
                 f"the plain step's whole loss computation {plain['graph_breaks_loss_computation']}")
    for part, key in (("forward", "graph_break_reasons"), ("loss computation", "graph_break_reasons_loss_computation")):
        lines += [f"graph break in the {part}: {r['times']} x {r['reason']} at {r['where']}" for r in plain[key]]
    lines.append(f"plain step: host syncs {plain['host_syncs']}, ops {plain['ops']}, "
                 f"graph breaks {plain['graph_breaks']}")
    lines.append(f"smart step: host syncs {smart['host_syncs']}, ops {smart['ops']}")
    return lines
