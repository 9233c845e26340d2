"""Checkpoints inside a stage (--save_steps, --save_every_minutes): a run stopped anywhere inside a stage and resumed
ends with the weights, scores and CSVs, byte for byte, of one never stopped. Stops are simulated by an exception
from the optimizer step after N updates (the process dies there, as kill -9 would leave it: with whatever last.*
holds), and made real with SIGKILL from outside, in one process and under torchrun with two gloo processes."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import minbert.training.loop as loop
import multitask_classifier as mc
from conftest import DEMO, ROOT, exit_code, prediction_flags, skip_figures
from runs_in_one_launch import launch
from minbert.training.training_state import read_training_state

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")

# Three stages of 6 updates each (24 examples, batches of 4): saves every 2 updates fall inside every stage.
SEQUENTIAL = ("--first_stages", "sst,qqp,sts", "--cycles", "0")
ANNEALED = ("--schedule", "annealed", "--epochs", "2", "--max_train_examples", "12")
SMART = ("--first_stages", "sts,sst", "--cycles", "0", "--smart")
# The thesis' SMART (scripts/_common.sh's THESIS_SMART_FLAGS): D_Breg anchored to the weights its stage started from,
# the anchor's forward with dropout on, the momentum schedule restarting each stage.
THESIS_SMART = (*SMART, "--smart_norm_level", "sentence", "--smart_projection", "rescale", "--smart_reduction", "max",
                "--smart_anchor_mode", "train", "--smart_momentum_schedule", "stage", "--smart_anchor", "stage_start")
# bf16 autocast reading the bf16 copies of the weights (--bf16_weights): the checkpoint holds the float32 weights only.
BF16_WEIGHTS = (*SMART, "--precision", "bf16", "--bf16_weights")
RUNS = {"sequential": SEQUENTIAL, "annealed": ANNEALED, "smart": SMART, "thesis_smart": THESIS_SMART,
        "bf16_weights": BF16_WEIGHTS}
CSVS = [f"{task}-{split}-out.csv" for task in ("sst", "para", "sts") for split in ("dev", "test")]


def run_flags(checkpoint, out, *extra) -> list[str]:
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--max_train_examples", "24", "--max_length", "32", "--batch_size", "4", "--eval_batch_size", "64",
            "--hidden_dropout_prob", "0.1", "--output_dir", str(out / "run"), *prediction_flags(out), *extra]


def outputs(out) -> dict[str, bytes]:
    """What must come out byte for byte: the kept model's weights, its scores and the six CSVs."""
    files = {"best.safetensors": (out / "run" / "best.safetensors").read_bytes()}
    files |= {f"scores/{path.name}": path.read_bytes() for path in sorted((out / "run" / "scores").glob("*.csv"))}
    files |= {name: (out / name).read_bytes() for name in CSVS}
    return files


class Killed(BaseException):
    """The process dying at an update: nothing catches it, nothing after it runs."""


def killed_after(monkeypatch, updates: int) -> None:
    """The next run dies as its update `updates` + 1 begins (its gradients computed, nothing stepped)."""
    original = loop.StepLoop.optimizer_step

    def optimizer_step(self, *args, **kwargs):
        if self.state.updates == updates:
            raise Killed
        return original(self, *args, **kwargs)
    monkeypatch.setattr(loop.StepLoop, "optimizer_step", optimizer_step)


def saved_position(out) -> dict | None:
    return json.loads((out / "run" / "last.json").read_text()).get("position")


@pytest.fixture(scope="module")
def never_stopped(tiny_checkpoint, tmp_path_factory):
    """The reference runs, without a checkpoint inside a stage, by their flags."""
    runs = {}
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        for name, flags in RUNS.items():
            out = tmp_path_factory.mktemp(name)
            assert mc.main(run_flags(tiny_checkpoint, out, *flags)) == 0
            runs[name] = outputs(out)
    return runs


@pytest.mark.parametrize("flags, killed_at, kept", [
    ("sequential", 3, 2),    # stage 1, after its second update
    ("sequential", 9, 8),    # stage 2, the first save after a stage's end
    ("sequential", 17, 16),  # stage 3, one update before its end
    ("annealed", 5, 4),      # the first multi-task epoch: the loaders restart, the tasks in annealed order
    ("annealed", 10, 10),    # right after the first update of the second epoch
    ("smart", 3, 2),         # SMART's Bregman anchor and its momentum schedule
    ("thesis_smart", 9, 8),  # inside stage 2: its anchor is the weights stage 2 started from, not the resumed ones
    ("bf16_weights", 9, 8),  # inside stage 2: the resumed run's copies are its float32 weights rounded again
])
def test_a_run_killed_inside_a_stage_resumes_to_the_same_bytes(never_stopped, tiny_checkpoint, tmp_path, monkeypatch,
                                                               flags, killed_at, kept):
    extra = RUNS[flags]
    killed_after(monkeypatch, killed_at)
    with pytest.raises(Killed):
        mc.main(run_flags(tiny_checkpoint, tmp_path, *extra, "--save_steps", "2"))
    position = saved_position(tmp_path)
    assert position is not None and read_training_state(tmp_path / "run" / "last")[1]["updates"] == kept
    monkeypatch.undo()
    skip_figures(monkeypatch)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *extra, "--save_steps", "2", "--resume")) == 0
    assert outputs(tmp_path) == never_stopped[flags]


@pytest.fixture(scope="module")
def pretraining_stages(tiny_checkpoint, tmp_path_factory):
    """The flags of a run of an mlm epoch (its masks drawn in order by a seeded generator), a SimCSE epoch and an SST
    stage, in fp16 with its gradient scaler, and that run never stopped."""
    folder = tmp_path_factory.mktemp("pretraining")
    triplets = folder / "triplets.csv"
    triplets.write_text("premise,positive,negative\n" + "".join(
        f"A man plays guitar number {i}.,A person plays music {i}.,Nobody plays anything {i}.\n" for i in range(16)))
    flags = ["--mlm_epochs", "1", "--simcse_data", str(triplets), "--first_stages", "sst", "--cycles", "0",
             "--max_train_examples", "8", "--precision", "fp16"]
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert mc.main(run_flags(tiny_checkpoint, folder / "whole", *flags)) == 0
    return flags, outputs(folder / "whole")


@pytest.mark.parametrize("killed_at, stage", [(3, 0), (12, 1)])
def test_mlm_simcse_and_fp16_resume_inside_their_stages(pretraining_stages, tiny_checkpoint, tmp_path, monkeypatch,
                                                        killed_at, stage):
    flags, whole = pretraining_stages
    killed_after(monkeypatch, killed_at)
    with pytest.raises(Killed):
        mc.main(run_flags(tiny_checkpoint, tmp_path, *flags, "--save_steps", "1"))
    assert saved_position(tmp_path)["stage"] == stage
    monkeypatch.undo()
    skip_figures(monkeypatch)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *flags, "--resume")) == 0
    assert outputs(tmp_path) == whole


def test_gradient_surgery_resumes_its_random_draws(tiny_checkpoint, tmp_path, monkeypatch):
    """PCGrad shuffles the tasks with the epoch's generator at every step (which changes the step only where
    several gradients conflict): the checkpoint keeps where the generator stood."""
    flags = [*ANNEALED, "--epochs", "1", "--max_train_examples", "24", "--gradient_surgery", "pcgrad"]
    draws = {"whole": [], "resumed": []}  # by run: the generator's state at each update's combination
    run = ["whole"]  # the run under way
    original = loop.SeparateTaskGradients.combine

    def combine(self, rng):
        draws[run[0]].append(rng.getstate())
        return original(self, rng)
    monkeypatch.setattr(loop.SeparateTaskGradients, "combine", combine)
    optimizer_step = loop.StepLoop.optimizer_step
    assert mc.main(run_flags(tiny_checkpoint, tmp_path / "whole", *flags)) == 0
    run[0] = "resumed"
    killed_after(monkeypatch, 3)
    with pytest.raises(Killed):
        mc.main(run_flags(tiny_checkpoint, tmp_path, *flags, "--save_steps", "1"))
    assert saved_position(tmp_path)["updates"] == 3
    monkeypatch.setattr(loop.StepLoop, "optimizer_step", optimizer_step)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *flags, "--resume")) == 0
    assert outputs(tmp_path) == outputs(tmp_path / "whole")
    # the stopped run combined updates 0-3 (it died as update 3 stepped), the resumed one 3 and after
    assert draws["resumed"] == draws["whole"][:4] + draws["whole"][3:]


def test_the_resumed_stage_logs_its_loss_as_the_uninterrupted_one(tiny_checkpoint, tmp_path, monkeypatch):
    """The stage's train loss and steps.jsonl's losses after the checkpoint come from the sums it kept."""
    flags = [*SEQUENTIAL, "--logging_steps", "4", "--save_steps", "3"]
    assert mc.main(run_flags(tiny_checkpoint, tmp_path / "whole", *flags)) == 0
    killed_after(monkeypatch, 11)
    with pytest.raises(Killed):
        mc.main(run_flags(tiny_checkpoint, tmp_path, *flags))
    monkeypatch.undo()
    skip_figures(monkeypatch)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *flags, "--resume")) == 0

    def losses(out):
        steps = [json.loads(line) for line in (out / "run" / "steps.jsonl").read_text().splitlines()]
        history = json.loads((out / "run" / "history.json").read_text())
        return [(s["update"], s["loss"]) for s in steps], [r.get("train_loss") for r in history]
    assert losses(tmp_path) == losses(tmp_path / "whole")


def test_a_stop_inside_a_stage_says_how_much_was_kept(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    original = loop.StepLoop.optimizer_step

    def interrupted(self, *args, **kwargs):
        if self.state.updates == 9:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)
    monkeypatch.setattr(loop.StepLoop, "optimizer_step", interrupted)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *SEQUENTIAL, "--save_steps", "2")) == 130
    last = tmp_path / "run" / "last"
    assert (f"interrupted: {last}.* kept 2 of 6 updates of stage 2 qqp and every stage before it; rerun the same "
            "command with --resume to continue there") in capsys.readouterr().err
    monkeypatch.undo()
    skip_figures(monkeypatch)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *SEQUENTIAL, "--resume", "--stop_after_stages", "2")) == 0
    assert "resuming inside stage 2 of 3: the checkpoint kept 2 of 6 updates of stage 2 qqp" in capsys.readouterr().out


def test_the_minutes_decide_when_to_save_never_what_is_trained(never_stopped, tiny_checkpoint, tmp_path, monkeypatch):
    """Saves due after a fraction of a microsecond: a checkpoint after nearly every update, and the same bytes."""
    saves = []  # the checkpoints inside a stage: those with the stage's progress
    original = loop.StepLoop.save

    def save(self, stage=None, description=""):
        saves.append(stage)
        original(self, stage, description)
    monkeypatch.setattr(loop.StepLoop, "save", save)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *SEQUENTIAL, "--save_every_minutes", "1e-8")) == 0
    assert len([stage for stage in saves if stage is not None]) >= 10
    assert outputs(tmp_path) == never_stopped["sequential"]


def test_save_every_minutes_is_on_for_cuda_only_by_default():
    import torch

    from minbert.run.run_settings import save_minutes
    from minbert.run.training_args import CUDA_SAVE_MINUTES
    assert save_minutes(None, torch.device("cuda")) == CUDA_SAVE_MINUTES == 20
    assert save_minutes(None, torch.device("cpu")) == 0
    assert save_minutes(0.0, torch.device("cuda")) == 0 and save_minutes(5.0, torch.device("cpu")) == 5


@pytest.mark.parametrize("flag, value", [("--save_steps", "-1"), ("--save_every_minutes", "-2"),
                                         ("--save_every_minutes", "nan")])
def test_negative_save_intervals_are_refused(tmp_path, capsys, flag, value):
    assert exit_code(["--data_dir", str(DEMO), "--output_dir", str(tmp_path), flag, value]) == 2
    assert f"{flag} must be" in capsys.readouterr().err


def resumed_with_edited_position(tiny_checkpoint, tmp_path, monkeypatch, capsys, killed_at: int, edit) -> int:
    """A sequential run killed after `killed_at` steps with a checkpoint every 2, its last.json position rewritten
    by `edit`, then resumed: the resume's exit code (its stderr is the only output left in capsys)."""
    killed_after(monkeypatch, killed_at)
    with pytest.raises(Killed):
        mc.main(run_flags(tiny_checkpoint, tmp_path, *SEQUENTIAL, "--save_steps", "2"))
    monkeypatch.undo()
    info = tmp_path / "run" / "last.json"
    metadata = json.loads(info.read_text())
    info.write_text(json.dumps({**metadata, "position": edit(metadata["position"])}))
    capsys.readouterr()
    return mc.main(run_flags(tiny_checkpoint, tmp_path, *SEQUENTIAL, "--resume"))


@pytest.mark.parametrize("edit, problem", [
    (lambda p: {**p, "stage": 0}, "must name stage 1 (next_stage)"),
    (lambda p: {**p, "steps_done": p["steps"]}, "steps_done must be a whole number from 1 to below its steps"),
    (lambda p: {**p, "updates": 0}, "updates must be a whole number from 1"),
    (lambda p: {**p, "losses": {"count": -1, "recent_count": 0}}, "counts of losses must be whole numbers"),
])
def test_a_hand_edited_position_is_one_clear_line(tiny_checkpoint, tmp_path, monkeypatch, capsys, edit, problem):
    assert resumed_with_edited_position(tiny_checkpoint, tmp_path, monkeypatch, capsys, 9, edit) == 2
    assert problem in capsys.readouterr().err


def test_a_checkpoint_inside_another_schedules_stage_is_refused(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    elsewhere = resumed_with_edited_position(tiny_checkpoint, tmp_path, monkeypatch, capsys, 3,
                                             lambda position: {**position, "label": "sts"})
    assert elsewhere == 2
    assert "stopped inside stage 1 sts, which is not that stage of this run's schedule" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# Real kills: SIGKILL from outside, once a checkpoint inside a stage has kept enough updates


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (torchrun's ranks run in sessions of their own: killing its group misses them)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def kill_tree(pid: int) -> None:
    """SIGKILL to `pid` and every descendant at once, as a machine that goes away; returns once all are gone."""
    tree = process_tree(pid)
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while any(map(running, tree[1:])) and time.monotonic() < deadline:  # the ranks' folder lock goes with them
        time.sleep(0.05)


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # gone
        return False


def killed_when_saved(command: list[str], last_json, updates: int) -> dict:
    """Start `command` and SIGKILL it with all its processes (torchrun and its ranks) as soon as last_json holds a
    checkpoint inside a stage of at least `updates` updates of the run; returns that position."""
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            try:
                saved = json.loads(last_json.read_text())
            except (OSError, ValueError):  # not written yet
                saved = {}
            if saved.get("position") and saved["updates"] >= updates:
                kill_tree(process.pid)
                break
            time.sleep(0.01)
        process.wait(timeout=60)
        assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()[-3000:]
    finally:
        if process.poll() is None:
            kill_tree(process.pid)
        process.stderr.close()
    return json.loads(last_json.read_text())["position"]


# Long stages (36 updates each) so that the kill lands inside one, with updates left to lose after it.
LONG = ("--max_train_examples", "144", "--first_stages", "sst,sts", "--cycles", "0", "--save_steps", "1")


def test_a_run_killed_with_sigkill_inside_a_stage_resumes_to_the_same_bytes(tiny_checkpoint, tmp_path):
    flags = run_flags(tiny_checkpoint, tmp_path, *LONG)
    position = killed_when_saved([sys.executable, "multitask_classifier.py", *flags], tmp_path / "run" / "last.json",
                                 updates=40)
    assert position["stage"] == 1 and 0 < position["updates"] < position["stage_updates"]
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert mc.main([*flags, "--resume"]) == 0
        assert mc.main(run_flags(tiny_checkpoint, tmp_path / "whole", *LONG[:-2])) == 0
    assert outputs(tmp_path) == outputs(tmp_path / "whole")


@pytest.mark.slow  # about 30 s; the fast tier resumes torchrun between stages (test_distributed) and one process here
@pytest.mark.distributed
def test_torchrun_killed_with_sigkill_inside_a_stage_resumes_to_the_same_bytes(tiny_checkpoint, tmp_path):
    """Two gloo processes: each rank's dropout stream and loss sums are kept, and the resumed ranks continue at the
    same batch. The resumed run and the one never stopped share a launch (tests/runs_in_one_launch.py)."""
    killed = run_flags(tiny_checkpoint, tmp_path / "killed", *LONG)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    position = killed_when_saved([*launcher, "multitask_classifier.py", *killed],
                                 tmp_path / "killed" / "run" / "last.json", updates=24)
    assert position["stage"] == 1 and 0 < position["updates"] < position["stage_updates"]
    runs = [["resumed", "multitask_classifier", [*killed, "--resume"]],
            ["whole", "multitask_classifier", run_flags(tiny_checkpoint, tmp_path / "whole", *LONG[:-2])]]
    outcomes = launch(tmp_path, 2, runs, timeout=600)
    for name in ("resumed", "whole"):
        assert outcomes[name]["returncodes"] == [0, 0], name
    assert "resuming inside stage 2 of 2" in outcomes["resumed"]["stdout"]
    assert outputs(tmp_path / "killed") == outputs(tmp_path / "whole")
