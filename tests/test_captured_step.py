"""--capture_step (issue 60, item 1): a task batch's whole step (forward, loss, backward, clipping, AdamW's update)
compiled as one graph (minbert/training/captured_step.py). On the CPU: the captured step is the eager step over 50
steps (dropout on: the aot_eager backend draws the masks from the same generator in the same order), a run with it
stopped and resumed ends byte for byte as one never stopped, the whole step traces with 0 graph breaks where today's
eager loss computation breaks, and what it cannot capture is refused in one line. Inductor's own kernels and CUDA
graphs are scripts/gpu_check.sh's (its captured_step check), not a CPU test's: inductor's C++ compile takes
minutes here, and CUDA graphs need CUDA."""
import itertools
import json
import math

import pytest
import torch

import minbert.run.run_settings as run_settings
import multitask_classifier as mc
from conftest import DEMO, exit_code, prediction_flags, skip_figures, tiny_model
from minbert.benchmarks.step_audit import graph_breaks, plain_step_graph_breaks, whole_step_graph_breaks
from minbert.training.captured_step import CapturedStep, capturing
from minbert.training.schedules import Stage, StageKind
from minbert.training.training_state import read_training_state
from test_trainer import make_trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def captured_with(monkeypatch, backend: str) -> None:
    """Runs built from now on capture their steps with this torch.compile backend (the CPU's is inductor)."""
    monkeypatch.setattr(run_settings, "capture_backend", lambda device: (backend, None))


def eager_and_captured(tmp_path, tokenizer, monkeypatch, tasks: list[str], steps: int, backend: str = "aot_eager",
                       **settings) -> dict:
    """Two trainers on the same tiny model, one stepping eagerly, one through --capture_step (torch.compile's
    `backend`), over the same `steps` batches (cycling through each task's batches, padded to the captured run's
    length bucket, on the padded layout both), the same dropout masks: by name, each's weights, AdamW's states,
    steps.jsonl lines and trainer."""
    captured_with(monkeypatch, backend)
    settings = dict(max_grad_norm=0.5, weight_decay=0.01, max_length=16, logging_steps=1) | settings
    trainers = {name: make_trainer(tmp_path / name, tokenizer, model=tiny_model(), capture_step=capture, **settings)
                for name, capture in (("eager", False), ("captured", True))}
    assert trainers["eager"].loop.captured is None and trainers["captured"].loop.captured is not None
    data = trainers["captured"].stage_data
    batches = [(task, batch) for task in tasks for batch in data.task_batches(Stage(StageKind.TASK, task), 0, 0)]
    runs = {}
    for name, trainer in trainers.items():
        trainer.model.bert.encoder.pack_tokens = False  # as run_setup places a --capture_step run's encoder
        lines = []
        trainer.run_log.step = lines.append
        torch.manual_seed(0)  # the dropout masks (and SMART's random starts)
        trainer.loop.run_steps(([step] for step in itertools.islice(itertools.cycle(batches), steps)), steps, "test")
        states = {name: trainer.optimizer.state[p] for name, p in trainer.model.named_parameters()}
        runs[name] = (trainer.model.state_dict(), states, lines, trainer)
    return runs


def assert_the_same_steps(runs: dict, steps: int) -> None:
    (eager, eager_states, eager_lines, _), (captured, captured_states, captured_lines, trainer) = runs.values()
    assert trainer.state.updates == steps and len(captured_lines) == steps
    for name in eager:
        torch.testing.assert_close(captured[name], eager[name], rtol=1e-5, atol=1e-6, msg=name)
    for name, state in eager_states.items():
        if state:  # the captured step creates every state at its first call; those without a gradient stay zero
            for key in state:
                torch.testing.assert_close(captured_states[name][key], state[key], rtol=1e-5, atol=1e-7)
        else:
            assert captured_states[name]["step"] == 0 and not captured_states[name]["exp_avg"].any()
    for ours, theirs in zip(captured_lines, eager_lines):
        assert set(ours) == set(theirs)
        for key in ("loss", "grad_norm", *(key for key in theirs if key.startswith("smart_"))):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-9), key


def test_the_captured_step_is_the_eager_step_over_50_steps(tmp_path, tokenizer, monkeypatch):
    """Weights, AdamW's moments and every step's loss and gradient norm, with dropout, clipping and weight decay:
    the same to float32 rounding (on this CPU they agree bit for bit). Both sides on the padded layout that
    --capture_step runs, on the same batches."""
    runs = eager_and_captured(tmp_path, tokenizer, monkeypatch, ["sst"], 50)
    data = runs["captured"][3].stage_data
    shapes = {tuple(batch["input_ids"].shape) for batch in data.task_batches(Stage(StageKind.TASK, "sst"), 0, 0)}
    assert shapes == {(4, 16)}  # one graph
    assert_the_same_steps(runs, 50)


@pytest.mark.parametrize("anchor, precision, tasks, backend", [
    ("moving_average", "exact", ["sst"], "eager"),
    # AOT autograd's compile of the traced step takes about 20 s a graph on 2 cores
    pytest.param("stage_start", "run", ["sst", "sts"], "aot_eager", marks=pytest.mark.slow)])
def test_the_captured_smart_step_is_the_eager_step(tmp_path, tokenizer, monkeypatch, anchor, precision, tasks,
                                                   backend):
    """SMART's whole step in the graph (its ascent's autograd.grad, the perturbed and anchor passes, the finiteness
    decision on the device), the moving-average anchor following each update outside the graph: weights, AdamW's
    states, the anchor, each step's loss, gradient norm, SMART's two terms and its dropped-term count, as the eager
    step's over 12 steps. The fast tier runs dynamo's graph with the eager backend; the slow tier compiles it with
    AOT autograd (aot_eager, as the plain step's test), with the thesis' anchor, at the run's precision, on a
    classification and a regression task (a graph each)."""
    runs = eager_and_captured(tmp_path, tokenizer, monkeypatch, tasks, 12, backend, smart=True, smart_anchor=anchor,
                              smart_precision=precision)
    assert_the_same_steps(runs, 12)
    penalties = {name: next(p for p in run[3].penalties if p.name == "smart") for name, run in runs.items()}
    for name, value in penalties["eager"].anchor.params.items():
        torch.testing.assert_close(penalties["captured"].anchor.params[name], value, rtol=1e-5, atol=1e-6, msg=name)
    skipped = penalties["captured"].skipped_steps()
    assert skipped == penalties["eager"].skipped_steps() and set(skipped.values()) == {0}
    lines = runs["captured"][2]
    assert all(line["smart_adversarial"] > 0 and line["smart_bregman"] >= 0 for line in lines)


def test_a_non_finite_ascent_is_dropped_on_the_device_inside_a_graph():
    """Inside a compiled graph nothing is read back: R_s of a non-finite ascent becomes 0 there, the drop is a
    device flag the regularizer counts, and the weights' gradients are the task loss's alone, as the eager step's."""
    from smart import SmartConfig, SmartRegularizer
    from test_smart import make_batch, make_model, task_loss
    model = make_model()
    batch = make_batch("paraphrase")
    regularizer = SmartRegularizer(model, SmartConfig(adv_weight=1.0, bregman_weight=0.0, ascent_steps=1))

    def step():
        embeddings = model.embed("paraphrase", batch)
        outputs = model.outputs_from_embeddings("paraphrase", embeddings, batch)
        calls = []

        def poisoned_ascent(perturbed):  # the ascent's pass (the first) gives NaN gradients; the R_s pass does not
            calls.append(None)
            scores = model.outputs_from_embeddings("paraphrase", perturbed, batch)
            return scores * math.nan if len(calls) == 1 else scores
        penalty = regularizer.penalty(poisoned_ascent, embeddings, outputs, "bernoulli")
        (task_loss("paraphrase", outputs, batch["labels"]) + penalty).backward()
        return penalty.detach()

    def gradients_of(taken) -> tuple[torch.Tensor, dict]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)  # the same dropout masks and random start
        penalty = taken()
        return penalty, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    with capturing():  # the ascent's autograd.grad and the backward traced, as --capture_step traces them
        penalty, captured = gradients_of(torch.compile(step, fullgraph=True, backend="eager"))
    assert penalty.item() == 0 and regularizer.skipped_steps == 1
    assert regularizer.skipped_host == 0  # counted on the device
    penalty, eager = gradients_of(step)  # R_s dropped on the host: a constant 0 added
    assert penalty.item() == 0 and regularizer.skipped_steps == 2 and regularizer.skipped_host == 1
    assert captured.keys() == eager.keys()
    for name, gradient in eager.items():
        assert torch.isfinite(captured[name]).all()
        torch.testing.assert_close(captured[name], gradient, rtol=0, atol=0, msg=name)


def run_flags(checkpoint, out, *extra) -> list[str]:
    """Two SST stages of 3 updates each (12 examples, batches of 4, one length bucket), a line of steps.jsonl every
    2 updates; the last checkpoint kept (its weights, AdamW's moments, the RNG states)."""
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--max_train_examples", "12", "--max_length", "16", "--batch_size", "4", "--eval_batch_size", "64",
            "--hidden_dropout_prob", "0.1", "--first_stages", "sst*2", "--cycles", "0", "--logging_steps", "2",
            "--max_grad_norm", "1", "--lr", "1e-3", "--keep_resume_state", "--capture_step",
            "--output_dir", str(out / "run"), *prediction_flags(out), *extra]


def outputs(out) -> dict[str, bytes]:
    """What must come out byte for byte: the kept model and the last checkpoint's tensors, the scores, the six CSVs
    and the losses and gradient norms of steps.jsonl."""
    run = out / "run"
    files = {name: (run / name).read_bytes() for name in ("best.safetensors", "last.safetensors")}
    files |= {f"scores/{path.name}": path.read_bytes() for path in sorted((run / "scores").glob("*.csv"))}
    files |= {path.name: path.read_bytes() for path in sorted(out.glob("*-out.csv"))}
    lines = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    files["steps.jsonl"] = json.dumps([(line["update"], line["loss"], line["grad_norm"]) for line in lines]).encode()
    return files


class Killed(BaseException):
    """The process dying as an update begins: nothing after it runs."""


@pytest.mark.slow  # three short runs (about 45 s on 2 cores): the eager path's resume is in the fast tier
@pytest.mark.parametrize("smart", [[], ["--smart"]], ids=["plain", "smart"])
def test_a_captured_run_stopped_and_resumed_ends_as_one_never_stopped(tiny_checkpoint, tmp_path, monkeypatch, smart):
    """Stopped between its stages (--stop_after_stages) and killed inside the second one (its checkpoint of
    --save_steps 2 kept), then resumed with --resume: the same bytes as the run never stopped, with SMART too (its
    anchor and dropped-term count in the checkpoint). The dynamo-traced graph run by the eager backend (the capture
    itself; aot_eager and inductor compile that same graph)."""
    captured_with(monkeypatch, "eager")
    skip_figures(monkeypatch)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path / "whole", *smart)) == 0
    whole = outputs(tmp_path / "whole")
    assert len(json.loads(whole["steps.jsonl"])) == 4  # updates 2 and 3 (the stage's end), 5 and 6

    stopped = tmp_path / "stopped"
    assert mc.main(run_flags(tiny_checkpoint, stopped, *smart, "--stop_after_stages", "1")) == 0
    assert mc.main(run_flags(tiny_checkpoint, stopped, *smart, "--resume")) == 0
    assert outputs(stopped) == whole

    killed, original, calls = tmp_path / "killed", CapturedStep.__call__, []

    def dies_at_the_fifth_update(self, *args):
        calls.append(None)
        if len(calls) == 5:
            raise Killed
        return original(self, *args)
    monkeypatch.setattr(CapturedStep, "__call__", dies_at_the_fifth_update)
    with pytest.raises(Killed):
        mc.main(run_flags(tiny_checkpoint, killed, *smart, "--save_steps", "2"))
    assert read_training_state(killed / "run" / "last")[1]["updates"] == 4  # inside stage 2
    monkeypatch.setattr(CapturedStep, "__call__", original)
    assert mc.main(run_flags(tiny_checkpoint, killed, *smart, "--save_steps", "2", "--resume")) == 0
    assert outputs(killed) == whole


def test_a_diverging_captured_run_stops_with_the_eager_runs_line(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """The losses the captured step returns are what the loop checks at each line of steps.jsonl: a run whose loss
    stops being finite stops there, in one line, before any model is kept."""
    captured_with(monkeypatch, "eager")
    skip_figures(monkeypatch)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--lr", "1e30")) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: training diverged in stage 1 sst: the loss of update ")
    assert not (tmp_path / "run" / "best.safetensors").exists()


def test_the_whole_step_traces_as_one_graph_where_the_eager_step_breaks(tmp_path, tokenizer):
    """torch._dynamo.explain of the captured step, the backward and AdamW's update included: 0 graph breaks (what
    step_audit reports). The same step without the captured step's settings breaks at the backward, and the eager
    step's loss computation, its layout built inside, breaks too: the count can fail."""
    trainer = make_trainer(tmp_path, tokenizer, model=tiny_model(), max_grad_norm=1.0, weight_decay=0.01)
    batch = next(iter(trainer.stage_data.task_batches(Stage(StageKind.TASK, "sst"), 0, 0)))
    assert plain_step_graph_breaks(trainer, "sst", batch)["loss computation"]["count"] > 0
    captured = CapturedStep(trainer.model, trainer.optimizer, trainer.parts.amp, 1.0)
    arguments = captured.prepare(trainer.loop.objective("sst"), batch, 1e-3)
    untraced_backward = graph_breaks(lambda: captured.step(*arguments))
    assert untraced_backward["count"] > 0
    assert any("backward" in reason["reason"] for reason in untraced_backward["reasons"])
    whole = whole_step_graph_breaks(trainer, "sst", batch)
    assert whole == {"count": 0, "reasons": []}


@pytest.mark.parametrize("flags, problem", [
    (["--precision", "fp16"], "--capture_step does not combine with --precision fp16"),
    (["--grad_accumulation_steps", "2"], "--capture_step does not combine with --grad_accumulation_steps > 1"),
    (["--schedule", "annealed", "--gradient_surgery", "pcgrad"], "--capture_step does not combine with "
                                                                 "--gradient_surgery"),
    (["--lnsr"], "--capture_step does not combine with --lnsr: the lnsr penalty is not captured"),
    (["--ewc_weight", "1"], "--capture_step does not combine with --ewc_weight: the ewc penalty is not captured"),
    (["--l2sp_weight", "0.1"], "--capture_step does not combine with --l2sp_weight: the l2sp penalty is not captured"),
    (["--distill", "teacher"], "--capture_step does not combine with --distill: the distillation penalty is not "
                               "captured"),
    (["--mlm_epochs", "1"], "--capture_step does not combine with --simcse_data, --mlm_epochs"),
    (["--compile"], "--capture_step does not combine with --compile"),
    (["--precision", "bf16", "--bf16_weights"], "--capture_step does not combine with --bf16_weights"),
    (["--gradient_checkpointing"], "--capture_step does not combine with --gradient_checkpointing"),
    (["--adapter", "lora"], "--capture_step does not combine with --adapter"),
])
def test_what_it_cannot_capture_is_refused_in_one_line(tmp_path, capsys, model_must_not_load, flags, problem):
    assert exit_code(["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run"), "--capture_step", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], lines


def test_a_penalty_is_on_as_its_file_says_or_as_its_flags_are_set():
    """PenaltyKind.is_on, which --capture_step's refusal asks of every penalty file before anything loads: the
    file's own `on`, else its switch, else any flag of its set away from its default (a new file saying nothing)."""
    from types import SimpleNamespace

    from minbert.training.objective import PenaltyFlag, PenaltyKind
    from minbert.training.penalties import PENALTY_KINDS
    quiet = PenaltyKind(name="drift", flags={"drift_weight": PenaltyFlag(0.0, ""), "drift_every": PenaltyFlag(1, "")},
                        build=lambda settings, model: None)
    assert not quiet.is_on(SimpleNamespace(drift_weight=0.0, drift_every=1))
    assert quiet.is_on(SimpleNamespace(drift_weight=0.5, drift_every=1))
    assert quiet.is_on(SimpleNamespace(drift_weight=0.0, drift_every=2))
    distillation = PENALTY_KINDS["distillation"]
    off = SimpleNamespace(distill=None, distill_override=[], score_train=True)
    assert not distillation.is_on(off)  # writing the train scores distils nothing
    assert distillation.is_on(SimpleNamespace(distill=None, distill_override=["qqp:teacher=t"], score_train=False))
    assert PENALTY_KINDS["smart"].is_on(SimpleNamespace(smart=True))
    assert not PENALTY_KINDS["smart"].is_on(SimpleNamespace(smart=False))


def test_smart_is_captured_with_the_step():
    """SMART is the one penalty --capture_step captures (PenaltyKind.captured): the flags go together."""
    from minbert.run.training_args import parse_training_args
    args = parse_training_args(["--data_dir", str(DEMO), "--capture_step", "--smart", "--smart_precision", "exact"], "")
    assert args.capture_step and args.smart


def test_fp16_resolved_on_the_device_is_refused_too():
    """--precision auto is fp16 on a T4 or V100: known only once the device is, and refused there."""
    from minbert.distributed import SINGLE_PROCESS
    from minbert.run.run_setup import check_captured_step
    from minbert.run.training_args import UsageError
    with pytest.raises(UsageError, match="--capture_step does not combine with fp16"):
        check_captured_step("fp16", SINGLE_PROCESS)
    check_captured_step("bf16", SINGLE_PROCESS)
