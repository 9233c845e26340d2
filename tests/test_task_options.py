"""A task's own options are the task's (issue 45): declared in its module (Task.options), made into flags, --config
and args.json keys by training_args, checked and read by the task, held by the model under the checkpoint's "heads"
keys they always had; and an option that another task or the command line already owns is refused in one line."""
import json
import os
import subprocess
import sys

import pytest

import minbert.run.training_args as training_args
from conftest import tiny_model
from minbert.model.multitask_bert import load_multitask_model, save_multitask_model
from minbert.run.training_args import TrainingArguments, build_parser, with_task_options
from minbert.tasks import TASKS, head_options, task_settings
from minbert.tasks.base import TaskOption
from minbert.tasks.classification import SentenceClassification
from minbert.tasks.registry import TaskModuleError, check_task_modules
from minbert.tasks.squad import QASettings
from test_new_task import copy_of_the_repository

TOY_TASK = '''"""Toy: a two-class sentence task with an option of its own, --toy_label_smoothing."""
from dataclasses import dataclass

import torch.nn.functional as F

from minbert.tasks.base import TaskOption
from minbert.tasks.classification import SentenceClassification, SentenceClassifierModel
from minbert.tasks.losses import ClassificationObjective


@dataclass(frozen=True)
class SmoothedObjective(ClassificationObjective):
    label_smoothing: float = 0.0

    def loss(self, logits, labels):
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing)


class ToyModel(SentenceClassifierModel):
    def objective(self, options):
        return SmoothedObjective(label_smoothing=options["toy_label_smoothing"])


@dataclass(frozen=True, kw_only=True, eq=False)
class Toy(SentenceClassification):
    model_part = ToyModel

    def check_settings(self, settings, pair_encoders):
        if not 0 <= self.own_settings(settings)["toy_label_smoothing"] < 1:
            raise ValueError("--toy_label_smoothing must be in [0, 1)")

    def head_options(self, settings):
        return self.own_settings(settings)


TASK = Toy(name="toy", order=10, trainable=True, title="Toy", file_prefix="toy", flag_prefix="toy",
           label_column="label", leaderboard_column="Predicted_Label", num_classes=2, head_name="toy_head",
           options=(TaskOption("toy_label_smoothing", 0.0, "label smoothing of the toy loss",
                               argparse=dict(type=float)),))
'''

# Run in the copy: the option from the flag, from a --config, into the model, through a checkpoint, and into the
# resume check, with no other file of the copy changed.
IN_THE_COPY = '''
import json, sys
from pathlib import Path
import multitask_classifier as mc
from base_bert import CheckpointError
from minbert.model.multitask_bert import load_multitask_model, save_multitask_model
from minbert.run.run_setup import build_model
from minbert.run.training_args import check_resume_arguments
pretrained, folder = sys.argv[1], Path(sys.argv[2])
args = mc.parse_args(["--tasks", "toy", "--toy_label_smoothing", "0.2", "--pretrained", pretrained])
model = build_model(args, {"toy"})
save_multitask_model(model, folder / "m", {})
heads = json.loads((folder / "m.json").read_text())["heads"]
(folder / "config.json").write_text(json.dumps({"tasks": "toy", "toy_label_smoothing": 0.3,
                                                "pretrained": pretrained}))
try:
    check_resume_arguments(vars(args), mc.parse_args(["--config", str(folder / "config.json")]))
    refused = ""
except CheckpointError as err:
    refused = str(err)
print(json.dumps({"flag": args.toy_label_smoothing, "trained": model.objectives["toy"].label_smoothing,
                  "saved": heads["toy_label_smoothing"],
                  "loaded": load_multitask_model(folder / "m").objectives["toy"].label_smoothing,
                  "refused": refused}))
'''


def test_an_option_declared_in_a_new_task_file_reaches_its_task(tmp_path, tiny_checkpoint):
    repo = copy_of_the_repository(tmp_path / "repo")
    (repo / "minbert" / "tasks" / "toy.py").write_text(TOY_TASK)
    environment = os.environ | {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    commands = {"help": [str(repo / "multitask_classifier.py"), "--help"],
                "bad": [str(repo / "multitask_classifier.py"), "--tasks", "toy", "--toy_label_smoothing", "1.5"],
                "reached": ["-c", IN_THE_COPY, str(tiny_checkpoint), str(tmp_path)]}
    started = {name: subprocess.Popen([sys.executable, *argv], cwd=repo, env=environment, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for name, argv in commands.items()}
    done = {name: (process.communicate(timeout=300), process.returncode) for name, process in started.items()}

    (help_text, _), code = done["help"]
    assert code == 0 and "--toy_label_smoothing TOY_LABEL_SMOOTHING" in help_text
    assert "label smoothing of the toy loss" in help_text
    (out, err), code = done["bad"]
    assert (code, out) == (2, "") and err.endswith("error: --toy_label_smoothing must be in [0, 1) (see --help)\n")
    assert len(err.splitlines()) == 1
    (out, err), code = done["reached"]
    assert code == 0, err[-3000:]
    reached = json.loads(out.splitlines()[-1])
    assert (reached["flag"], reached["trained"], reached["saved"], reached["loaded"]) == (0.2, 0.2, 0.2, 0.2)
    # a --config sets it, and a resume that changes it is refused, naming it alone
    assert "1 flag(s) differ" in reached["refused"] and "--toy_label_smoothing 0.2 -> 0.3" in reached["refused"]


def toy(**fields) -> SentenceClassification:
    return SentenceClassification(**{**dict(name="toy", order=10, title="Toy", file_prefix="toy", flag_prefix="toy",
                                            label_column="label", leaderboard_column="Predicted_Label",
                                            num_classes=2, head_name="toy_head"), **fields})


@pytest.mark.parametrize("option, owner", [("similarity_objective", "minbert/tasks/sts.py"),
                                           ("para_train", "minbert/tasks/qqp.py"),
                                           ("qa_n_best", "minbert/tasks/qa.py")])
def test_an_option_another_task_owns_is_refused_naming_both_files(option, owner):
    modules = {f"minbert/tasks/{task}.py": TASKS[task] for task in ("sst", "qqp", "sts", "qa")}
    modules["minbert/tasks/toy.py"] = toy(options=(TaskOption(option, 0, "taken"),))
    with pytest.raises(TaskModuleError, match=f"minbert/tasks/toy.py: its flag '--{option}' is already {owner}'s"):
        check_task_modules(modules)


def test_an_option_named_as_a_flag_of_the_command_line_is_refused_in_one_line(monkeypatch, capsys):
    """The command line keeps its own --lr, and says which task file claims it."""
    monkeypatch.setattr(training_args, "TASKS", {**TASKS, "toy": toy(options=(TaskOption("lr", 0.1, "taken"),))})
    monkeypatch.setattr(training_args, "TASK_FILES", {"toy": "minbert/tasks/toy.py"})
    with pytest.raises(SystemExit) as exit:
        build_parser(TrainingArguments, "test")
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.splitlines()) == 1
    assert "error: minbert/tasks/toy.py: its flag --lr is already " in err and err.endswith("'s own\n")


def test_the_tasks_options_need_a_place_among_the_settings():
    """A renamed anchor field would otherwise drop every task's flags without a word."""
    with pytest.raises(TypeError, match="has no field 'nowhere'"):
        with_task_options(after="nowhere")(type("Settings", (), {"__annotations__": {"lr": "float"}}))


def test_the_tasks_options_are_the_flags_args_json_and_checkpoint_keys_they_were():
    """Users' recipes and records name these; checkpoints written before hold these "heads" keys."""
    args = TrainingArguments()
    assert {name: getattr(args, name) for name in task_settings({})} == {
        "sst_objective": "ce", "ordinal_weight": 1.0, "similarity_objective": "cosine", "sts_cosine_dropout": False,
        "qa_max_length": 384, "qa_doc_stride": 128, "qa_max_answer_tokens": 30, "qa_n_best": 20}
    assert head_options({}) == {"sentiment_ordinal_weight": 0.0, "similarity_objective": "cosine",
                                "sts_cosine_dropout": False}
    assert head_options({"sst_objective": "ordinal", "ordinal_weight": 0.5}) == {
        "sentiment_ordinal_weight": 0.5, "similarity_objective": "cosine", "sts_cosine_dropout": False}
    assert TASKS["qa"].windowing(task_settings({"qa_max_length": 96})) == QASettings(max_length=96)


# The "heads" of a checkpoint written before the tasks held their options, key order and all; the first MultitaskBERT
# checkpoints had no sts_cosine_dropout.
OLD_HEADS = {"pooling": "mean", "dropout": 0.1, "pair_encoder": {"qqp": "sbert", "sts": "sbert"},
             "similarity_objective": "cosent", "sentiment_ordinal_weight": 0.5, "head_hidden": 0,
             "head_activation": "tanh", "adapter": None, "tasks": ["sst", "qqp", "sts"]}


def test_a_checkpoint_written_before_loads_with_its_task_options(tmp_path):
    model = tiny_model(similarity_objective="cosent", sentiment_ordinal_weight=0.5)
    save_multitask_model(model, tmp_path / "m", {})
    info = json.loads((tmp_path / "m.json").read_text())
    info["heads"] = OLD_HEADS
    (tmp_path / "m.json").write_text(json.dumps(info))
    loaded = load_multitask_model(tmp_path / "m")
    assert loaded.task_options == {"sentiment_ordinal_weight": 0.5, "similarity_objective": "cosent",
                                   "sts_cosine_dropout": False}
    assert loaded.objectives["sst"].ordinal_weight == 0.5 and loaded.objectives["sts"].name == "cosent"


def test_an_option_no_task_has_is_refused_naming_it():
    with pytest.raises(ValueError, match="no task has the option 'similarity'"):
        tiny_model(similarity="cosent")


@pytest.mark.parametrize("settings, problem", [
    (dict(sst_objective="ordinl"), "--sst_objective must be one of ce, ordinal, got 'ordinl'"),
    (dict(qa_doc_stride=0), "--qa_doc_stride must be >= 1, got 0"),
    (dict(qa_max_length=64, qa_doc_stride=64), "--qa_doc_stride must be below --qa_max_length"),
    (dict(pair_encoder="sts:cross", sts_cosine_dropout=True), "--sts_cosine_dropout applies to the STS cosine")])
def test_each_task_checks_its_own_options_by_their_flags(settings, problem):
    """--sst_objective given in code or a recipe was not checked before: anything but ordinal trained ce silently."""
    with pytest.raises(ValueError, match=problem):
        TrainingArguments(**settings)
