"""steps.jsonl and TensorBoard (step_log.py): a line every --logging_steps updates and at each stage's end with every
field, SMART's, LNSR's and fp16's terms when they are on, the gradient norm measured alike with and without
clipping, no host sync outside the lines, the progress bar in examples, what --report_to tensorboard writes read
back with TensorBoard's own reader, and a resumed run's lines and events those of a run never stopped."""
import json
import math
import sys

import pytest
from test_gpu_step import RecordedObjective, count_syncs, first_batch
from test_trainer import make_trainer

import minbert.step_log as step_log
import multitask_classifier as mc
from conftest import DEMO, prediction_flags, skip_figures

pytestmark = pytest.mark.usefixtures("one_thread")

EVERY_LINE = {"update", "stage", "task", "loss", "lr", "grad_norm", "seconds", "examples_per_second"}
TIMING = ("seconds", "examples_per_second")


def lines_of(run) -> list[dict]:
    return [json.loads(text) for text in (run / "steps.jsonl").read_text().splitlines()]


def train_steps(trainer, tasks=("sst",), batches: int = 5, record=None) -> list[float]:
    """`batches` micro-steps cycling through `tasks` (one fixed batch each), as one stage; returns their losses.
    `record(loss)` is also called after each batch's forward."""
    fixed = {task: first_batch(trainer, task) for task in tasks}
    losses = []

    def recorded(loss):
        losses.append(float(loss.detach()))
        if record is not None:
            record(loss)
    for task in tasks:
        trainer.loop.objectives[task] = RecordedObjective(trainer.loop.objective(task), recorded)
    steps = [[(tasks[i % len(tasks)], fixed[tasks[i % len(tasks)]])] for i in range(batches)]
    trainer.loop.run_steps(iter(steps), batches, "stage 1 " + "+".join(tasks))
    return losses


# ---------------------------------------------------------------------------------------------------
# The lines


def test_a_line_every_logging_steps_updates_and_at_the_stage_end_with_every_field(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, logging_steps=2, lr=2e-3)
    losses = train_steps(trainer)
    lines = lines_of(tmp_path / "run")
    assert [line["update"] for line in lines] == [2, 4, 5]
    assert all(set(line) == EVERY_LINE for line in lines)
    assert [line["loss"] for line in lines] == pytest.approx([sum(losses[:2]) / 2, sum(losses[2:4]) / 2, losses[4]])
    assert all(line["stage"] == "stage 1 sst" and line["task"] == "sst" and line["lr"] == 2e-3 for line in lines)
    assert all(line["grad_norm"] > 0 and line["seconds"] > 0 for line in lines)
    # 4 examples a batch: two batches a line, then the stage's last one
    assert [line["examples_per_second"] * line["seconds"] for line in lines] == pytest.approx([8, 8, 4])


def test_accumulated_micro_steps_log_at_their_update(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, logging_steps=2, grad_accumulation_steps=2)
    losses = train_steps(trainer)
    lines = lines_of(tmp_path / "run")
    assert [line["update"] for line in lines] == [2, 3]  # updates of 2 + 2 + 1 micro-steps
    assert [line["loss"] for line in lines] == pytest.approx([sum(losses[:4]) / 4, losses[4]])


def test_the_gradient_norm_is_the_same_whether_clipping_computes_it_or_the_line_asks_for_it(tmp_path, tokenizer):
    runs = {}
    for max_grad_norm in (0.0, 1e9):  # 1e9: clipping that computes the norm and changes nothing
        trainer = make_trainer(tmp_path / str(max_grad_norm), tokenizer, logging_steps=1, max_grad_norm=max_grad_norm)
        train_steps(trainer, batches=3)
        runs[max_grad_norm] = lines_of(tmp_path / str(max_grad_norm) / "run")
    for unclipped, clipped in zip(runs[0.0], runs[1e9]):
        assert unclipped["grad_norm"] == pytest.approx(clipped["grad_norm"], rel=1e-6)
        assert unclipped["loss"] == clipped["loss"]


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_only_the_lines_read_the_device_back_one_transfer_each(tmp_path, tokenizer, monkeypatch, max_grad_norm):
    trainer = make_trainer(tmp_path, tokenizer, logging_steps=3, max_grad_norm=max_grad_norm)
    transfers = []

    original = step_log.read_back

    def read_back(values):
        transfers.append(trainer.state.updates)
        return original(values)
    monkeypatch.setattr(step_log, "read_back", read_back)
    steps = [[("sst", first_batch(trainer, "sst"))]] * 7
    syncs = count_syncs(lambda: trainer.loop.run_steps(iter(steps), 7, "stage 1 sst"))
    assert transfers == [3, 6, 7] and len(syncs) == 2, syncs  # the stage's end: its mean and divergence flag


def test_tasks_trained_between_two_lines_are_named_with_their_own_losses(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, logging_steps=4)
    losses = train_steps(trainer, tasks=("sst", "qqp"), batches=4)
    (line,) = lines_of(tmp_path / "run")
    assert line["task"] == "sst,qqp" and set(line) == EVERY_LINE | {"task_loss"}
    assert line["task_loss"] == pytest.approx({"sst": (losses[0] + losses[2]) / 2, "qqp": (losses[1] + losses[3]) / 2})
    assert line["loss"] == pytest.approx(sum(losses) / 4)


def test_smart_lnsr_and_fp16_add_their_terms(tmp_path, tokenizer):
    # fp16 autocast runs on the CPU too (slowly: a tiny model and a few steps)
    trainer = make_trainer(tmp_path, tokenizer, logging_steps=2, smart=True, smart_adv_weight=2.0, lnsr=True,
                           lnsr_tasks="sst", lnsr_layer=0, precision="fp16")
    regularizer = trainer.penalty("smart").regularizers["sst"]
    terms = []
    train_steps(trainer, batches=3, record=lambda loss: terms.append(
        {name: float(value) for name, value in regularizer.terms.items()}))
    lines = lines_of(tmp_path / "run")
    added = {"smart_adversarial", "smart_bregman", "smart_skipped_steps", "lnsr", "fp16_scale", "fp16_skipped_updates"}
    assert [line["update"] for line in lines] == [2, 3]
    assert all(set(line) == EVERY_LINE | added for line in lines)
    for name in ("adversarial", "bregman"):
        assert [line[f"smart_{name}"] for line in lines] == pytest.approx(
            [(terms[0][name] + terms[1][name]) / 2, terms[2][name]])
    assert all(line["lnsr"] > 0 and math.isfinite(line["lnsr"]) for line in lines)
    assert all(line["fp16_scale"] == trainer.parts.scaler.get_scale() for line in lines)
    assert lines[-1]["fp16_skipped_updates"] == trainer.state.skipped_updates
    assert lines[-1]["smart_skipped_steps"] == regularizer.skipped_steps


def test_the_progress_bar_counts_examples_with_their_rate(tmp_path, tokenizer, capsys):
    trainer = make_trainer(tmp_path, tokenizer, quiet=False)
    train_steps(trainer, batches=3)
    bar = capsys.readouterr().err
    assert "/12 [" in bar and "ex/s" in bar  # 3 batches of 4 examples; tqdm's time left follows from the rate


# ---------------------------------------------------------------------------------------------------
# Through the command line: TensorBoard and --resume


def run_flags(checkpoint, out, *extra) -> list[str]:
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--first_stages", "sst,qqp,sts",
            "--cycles", "0", "--precision", "fp32", "--logging_steps", "1", "--report_to", "tensorboard",
            "--output_dir", str(out / "run"), *prediction_flags(out), *extra]


def scalars(run) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's view of the run's events, read with its own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def without_timing(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in line.items() if k not in TIMING} for line in lines]


@pytest.fixture(scope="module")
def whole_run(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert mc.main(run_flags(tiny_checkpoint, out)) == 0
    return out / "run"


def test_tensorboard_holds_the_lines_and_each_stages_metrics(whole_run):
    lines = lines_of(whole_run)
    assert [line["update"] for line in lines] == [1, 2, 3, 4, 5, 6]  # three stages of two updates
    assert [line["task"] for line in lines] == ["sst", "sst", "qqp", "qqp", "sts", "sts"]
    read = scalars(whole_run)
    for name in ("loss", "lr", "grad_norm", "seconds", "examples_per_second"):
        assert read[f"train/{name}"] == [(line["update"], pytest.approx(line[name], rel=1e-6)) for line in lines]
    records = [json.loads(text) for text in (whole_run / "metrics.jsonl").read_text().splitlines()]
    steps = [0, 2, 4, 6]  # the pretrained model's, then each stage's update count
    for metric in ("sst_acc", "qqp_acc", "sts_pearson", "overall"):
        assert read[f"dev/{metric}"] == [(step, pytest.approx(r[metric], rel=1e-6)) for step, r in zip(steps, records)]
    assert read["stage/train_loss"] == [(step, pytest.approx(r["train_loss"], rel=1e-6))
                                        for step, r in zip(steps[1:], records[1:])]
    events = set((whole_run / "tensorboard").iterdir())
    assert events and events <= set(mc.earlier_run_files(whole_run, []))  # a fresh run in the folder removes them


def test_a_resumed_run_logs_as_one_never_stopped(whole_run, tiny_checkpoint, tmp_path, monkeypatch):
    skip_figures(monkeypatch)
    run = tmp_path / "run"
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    assert [line["update"] for line in lines_of(run)] == [1, 2]
    # As a kill in stage 2 leaves them: lines and events after the checkpoint, the last line cut short.
    with open(run / "steps.jsonl", "a") as handle:
        handle.write(json.dumps({"update": 3, "loss": 99.0}) + "\n" + '{"update": 4, "lo')
    from torch.utils.tensorboard import SummaryWriter
    with SummaryWriter(str(run / "tensorboard")) as writer:
        writer.add_scalar("train/loss", 99.0, 3)
        writer.add_scalar("dev/sst_acc", 99.0, 4)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--resume")) == 0
    assert without_timing(lines_of(run)) == without_timing(lines_of(whole_run))
    resumed, whole = scalars(run), scalars(whole_run)
    for tag in ("train/loss", "train/grad_norm", "dev/sst_acc", "dev/overall", "stage/train_loss"):
        assert resumed[tag] == whole[tag], tag


def test_report_to_tensorboard_without_tensorboard_is_one_line_before_any_model_loads(
        tiny_checkpoint, tmp_path, monkeypatch, capsys, model_must_not_load):
    forget_tensorboard(monkeypatch)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    with pytest.raises(SystemExit) as stop:
        mc.main(run_flags(tiny_checkpoint, tmp_path))
    error = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(error) == 1
    assert "--report_to tensorboard needs the tensorboard package: pip install tensorboard" in error[0]


def installed_tensorboard(monkeypatch, folder, init: str) -> None:
    """A `tensorboard` package whose __init__.py is `init` in place of the real one, for this test."""
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / "__init__.py").write_text(init)
    forget_tensorboard(monkeypatch)
    monkeypatch.syspath_prepend(str(folder))


def forget_tensorboard(monkeypatch) -> None:
    """The imports of TensorBoard that earlier tests cached set aside for this test, so that the next one is real."""
    for name in [name for name in sys.modules if name.split(".")[0] == "tensorboard"
                 or name.startswith("torch.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("init, problem", [
    # protobuf newer than the one the package's generated _pb2 files were made for
    ("raise TypeError('Descriptors cannot be created directly.\\nIf this call came from a _pb2.py file, ...')",
     "TypeError: Descriptors cannot be created directly."),
    ("", "TensorBoard logging requires TensorBoard version 1.15 or above"),  # too old to have __version__
])
def test_report_to_tensorboard_with_a_broken_tensorboard_is_one_line_before_any_model_loads(
        tiny_checkpoint, tmp_path, monkeypatch, capsys, model_must_not_load, init, problem):
    installed_tensorboard(monkeypatch, tmp_path, init)
    with pytest.raises(SystemExit) as stop:
        mc.main(run_flags(tiny_checkpoint, tmp_path))
    error = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(error) == 1, error
    assert "--report_to tensorboard needs torch.utils.tensorboard, which fails to import" in error[0]
    assert problem in error[0] and "pip install --upgrade tensorboard" in error[0]
