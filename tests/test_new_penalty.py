"""A new regulariser is a new file: a toy penalty (the trainable weights' squared distance from where their stage
started, with its anchor in the checkpoint) written as one module in the minbert/training/penalties/ folder of a copy
of the repository (nothing else in the copy changed), with its flag. The copy trains the demo's tasks with it,
stops inside a stage, resumes to the bytes of a run never stopped, and refuses a resume that changes its weight; a
penalty file that takes a flag of the command line's own stops it in one line."""
import json
import os
import subprocess
import sys

import pytest

from conftest import DEMO, prediction_flags
from test_new_task import copy_of_the_repository

TOY_PENALTY = '''"""Toy: weight * the squared distance of the trainable weights from their values when the stage started."""
import math

from minbert.training.objective import Penalty, PenaltyFlag, PenaltyKind


class StageDrift(Penalty):
    name = "drift"

    def __init__(self, model, weight):
        self.weight = weight
        self.start_stage(model)

    def start_stage(self, model):
        self.start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def terms(self, forward):
        live = dict(forward.model.named_parameters())
        return {"drift": self.weight * sum(((live[n] - s) ** 2).sum() for n, s in self.start.items())}

    def state_tensors(self):
        return {f"drift.{n}": s for n, s in self.start.items()}

    def load_state(self, tensors, metadata, device):
        self.start = {n: tensors[f"drift.{n}"].to(device) for n in self.start}


def check(settings):
    if not (math.isfinite(settings.drift_weight) and settings.drift_weight >= 0):
        raise ValueError(f"--drift_weight must be a finite number >= 0, got {settings.drift_weight}")


PENALTY = PenaltyKind(name="drift", flags={"drift_weight": PenaltyFlag(0.0, "the drift penalty's weight")},
                      build=lambda settings, model: StageDrift(model, settings.drift_weight) if settings.drift_weight
                      else None, check=check)
'''
# Dies as update 10 begins (the fourth of the second stage) (its gradients computed, nothing stepped), as kill -9 would leave it: with last.* as saved.
KILLED = '''import sys
import minbert.training.loop as steps
import multitask_classifier as mc
original = steps.StepLoop.optimizer_step
def optimizer_step(self, *args, **kwargs):
    if self.state.updates == 9:
        raise SystemExit(99)
    return original(self, *args, **kwargs)
steps.StepLoop.optimizer_step = optimizer_step
sys.exit(mc.main(sys.argv[1:]))
'''


@pytest.mark.slow
def test_a_new_penalty_is_one_new_file(tmp_path, tiny_checkpoint):
    repo = copy_of_the_repository(tmp_path / "repo")
    (repo / "minbert" / "training" / "penalties" / "drift.py").write_text(TOY_PENALTY)
    (tmp_path / "killed.py").write_text(KILLED)
    environment = os.environ | {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}

    def flags(out, *extra) -> list[str]:
        return ["--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
                "--precision", "fp32", "--max_train_examples", "24", "--max_length", "32", "--batch_size", "4",
                "--first_stages", "sst,sts", "--cycles", "0", "--drift_weight", "0.5", "--output_dir",
                str(out / "run"), *prediction_flags(out), *extra]

    def run(script, *argv) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *argv], cwd=repo, env=environment, capture_output=True,
                              text=True, timeout=300)

    def outputs(out) -> dict[str, bytes]:
        files = {path.relative_to(out): path.read_bytes() for path in sorted(out.glob("*.csv"))}
        files |= {path.relative_to(out): path.read_bytes() for path in sorted((out / "run" / "scores").glob("*"))}
        return files | {"best": (out / "run" / "best.safetensors").read_bytes()}

    whole = run(repo / "multitask_classifier.py", *flags(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "whole" / "run" / "steps.jsonl").read_text().splitlines()]
    assert all(line["drift"] > 0 for line in steps)  # in the loss it trains on, and in what the steps report

    killed = run(tmp_path / "killed.py", *flags(tmp_path / "parts", "--save_steps", "2"))
    assert killed.returncode == 99, killed.stderr[-3000:]
    saved = json.loads((tmp_path / "parts" / "run" / "last.json").read_text())
    # Inside the second stage (6 updates each), whose drift anchor only the checkpoint holds.
    assert saved["position"]["stage"] == 1 and saved["updates"] == 8
    assert saved["args"]["drift_weight"] == 0.5

    changed = run(repo / "multitask_classifier.py", *flags(tmp_path / "parts", "--save_steps", "2", "--resume",
                                                           "--drift_weight", "0.25"))
    assert changed.returncode == 2 and "--drift_weight 0.5 -> 0.25" in changed.stderr
    assert len(changed.stderr.strip().splitlines()) == 1

    resumed = run(repo / "multitask_classifier.py", *flags(tmp_path / "parts", "--save_steps", "2", "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert outputs(tmp_path / "parts") == outputs(tmp_path / "whole")

    bad = run(repo / "multitask_classifier.py", *flags(tmp_path / "bad"), "--drift_weight", "nan")
    assert bad.returncode == 2 and "--drift_weight must be a finite number >= 0" in bad.stderr
    captured = run(repo / "multitask_classifier.py", *flags(tmp_path / "captured"), "--capture_step")
    assert captured.returncode == 2 and len(captured.stderr.splitlines()) == 1
    assert "error: --capture_step does not combine with --drift_weight: the drift penalty is not captured" in \
        captured.stderr

    (repo / "minbert" / "training" / "penalties" / "drift.py").write_text(
        TOY_PENALTY.replace('{"drift_weight": PenaltyFlag', '{"seed": PenaltyFlag'))
    taken = run(repo / "multitask_classifier.py", "--help")
    assert taken.returncode == 2 and taken.stderr == ("error: minbert/training/penalties/drift.py: its flag --seed is "
                                                      "already the command line's own\n")


# A SMART flag that scales lambda_s, added to SMART's penalty file and nowhere else: its flag, and its use where the
# file resolves each task's SmartConfig.
SMART_FLAG = ('''        "smart_adv_weight": PenaltyFlag(1.0, "lambda_s"),\n''',
              '''        "smart_adv_weight": PenaltyFlag(1.0, "lambda_s"),\n'''
              '''        "smart_adv_scale": PenaltyFlag(1.0, "multiplies lambda_s"),\n''')
SMART_USE = ("adv_weight=settings.smart_adv_weight,",
             "adv_weight=settings.smart_adv_weight * settings.smart_adv_scale,")
# Builds the run's penalties on a tiny model, as run_setup does, and prints SMART's lambda_s per task.
BUILD_SMART = '''import dataclasses, json, sys
sys.path.insert(0, "tests")
from conftest import tiny_model
from minbert.run.run_settings import penalty_settings
from minbert.run.training_args import parse_training_args
from minbert.training.penalties import build_penalties
args = parse_training_args(sys.argv[1:], "")
[smart] = build_penalties(penalty_settings(args, 2), tiny_model())
print(json.dumps({"adv_weight": {task: r.config.adv_weight for task, r in smart.regularizers.items()},
                  "saved": dataclasses.asdict(args)["smart_adv_scale"]}))
'''


def test_a_new_smart_flag_is_an_edit_of_smart_s_penalty_file_alone(tmp_path):
    """SMART is one file like every penalty: a flag added to minbert/training/penalties/smart.py alone becomes
    multitask_classifier.py's, in SMART's group, refused without --smart, saved with the settings, and reaches each
    task's SmartConfig in the penalty the run builds (a task's --smart_override still wins)."""
    repo = copy_of_the_repository(tmp_path / "repo")
    smart_file = repo / "minbert" / "training" / "penalties" / "smart.py"
    source = smart_file.read_text()
    assert source.count(SMART_FLAG[0]) == 1 and source.count(SMART_USE[0]) == 1
    smart_file.write_text(source.replace(*SMART_FLAG).replace(*SMART_USE))
    (tmp_path / "build_smart.py").write_text(BUILD_SMART)
    environment = os.environ | {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}

    def run(*argv) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], cwd=repo, env=environment, capture_output=True, text=True,
                              timeout=300)

    shown = run("multitask_classifier.py", "--help")
    assert shown.returncode == 0, shown.stderr[-3000:]
    smart_group = shown.stdout.split("SMART (Jiang et al. 2020)")[1].split("LNSR, layer-wise")[0]
    assert smart_group.index("--smart_adv_weight") < smart_group.index("--smart_adv_scale SMART_ADV_SCALE") < \
        smart_group.index("--smart_bregman_weight")

    alone = run("multitask_classifier.py", "--smart_adv_scale", "3", "--output_dir", str(tmp_path / "run"))
    assert alone.returncode == 2 and "--smart_adv_scale does nothing without --smart" in alone.stderr

    built = run(str(tmp_path / "build_smart.py"), "--tasks", "sst,sts", "--smart", "--smart_adv_weight", "2",
                "--smart_adv_scale", "3", "--smart_override", "SST:adv_weight=5")
    assert built.returncode == 0, built.stderr[-3000:]
    assert json.loads(built.stdout) == {"adv_weight": {"sst": 5.0, "sts": 6.0}, "saved": 3.0}


def test_the_built_in_penalties_flags_are_their_files_own():
    """Every --smart*, --lnsr* and --distill* flag of multitask_classifier.py is declared by its penalty file
    (smart.py, lnsr.py, distillation.py of minbert/training/penalties/), and minbert/run/ defines none of them."""
    import dataclasses
    import re
    from pathlib import Path

    from minbert.run.training_args import TrainingArguments
    from minbert.training.penalties import PENALTY_KINDS
    owners = {"smart": "smart", "lnsr": "lnsr", "distill": "distillation"}
    for f in dataclasses.fields(TrainingArguments):
        prefix = next((p for p in owners if f.name.startswith(p)), None)
        if prefix:
            assert f.name in PENALTY_KINDS[owners[prefix]].flags, f"--{f.name} is not {owners[prefix]}.py's"
    run_layer = Path(__file__).resolve().parents[1] / "minbert" / "run"
    definition = re.compile(r"^\s*(smart|lnsr|distill)\w*\s*:[^=]*=\s*flag\(|add_argument\(\s*[\"']--(smart|lnsr|"
                            r"distill)", re.MULTILINE)
    for path in run_layer.glob("*.py"):
        assert not definition.search(path.read_text()), f"{path.name} defines a penalty's flag"
    # Every task's objective applies them first, in this order, as before they were files (PenaltyKind.early).
    assert list(PENALTY_KINDS)[:3] == ["distillation", "lnsr", "smart"]


def test_a_penalty_whose_flags_follow_no_flag_stops_the_command_line(tmp_path):
    repo = copy_of_the_repository(tmp_path / "repo")
    (repo / "minbert" / "training" / "penalties" / "drift.py").write_text(
        TOY_PENALTY.replace("check=check)", 'check=check, after="no_such_flag")'))
    shown = subprocess.run([sys.executable, "multitask_classifier.py", "--help"], cwd=repo, capture_output=True,
                           text=True, env=os.environ | {"PYTHONPATH": str(repo)}, timeout=300)
    assert shown.returncode == 2 and shown.stderr == ("error: minbert/training/penalties/drift.py: its flags follow "
                                                      "--no_such_flag, which is no flag of the command line\n")
