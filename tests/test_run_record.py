"""A run is its own recipe (issue 37, item 3): OUTPUT_DIR/args.json, --config FILE reading it back (flags on the
command line winning, checked as the command line is), and scripts/write_args_json.py for older runs."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minbert.run.run_record as run_record
import multitask_classifier as mc
from conftest import DEMO, ROOT, exit_code, skip_figures
from minbert.run.training_args import TrainingArguments

sys.path.insert(0, str(ROOT / "scripts"))
import write_args_json  # noqa: E402

OUTPUTS = [f"{task}-{split}-out.csv" for task in ("sst", "para", "sts") for split in ("dev", "test")]


def output_flags(run: Path) -> list[str]:
    """--output_dir RUN and the six CSVs inside it."""
    flags = ["--output_dir", str(run)]
    for name in OUTPUTS:
        flags += [f"--{name.removesuffix('-out.csv').replace('-', '_')}_out", str(run / "predictions" / name)]
    return flags


def run_flags(checkpoint, run: Path, *extra) -> list[str]:
    """A CLI run in seconds (tests/test_distillation.py's)."""
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--first_stages", "sst,qqp",
            "--cycle", "sts", "--cycles", "1", *output_flags(run), *extra]


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def first_run(tiny_checkpoint, tmp_path_factory):
    run = tmp_path_factory.mktemp("recipe") / "A"
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert mc.main(run_flags(tiny_checkpoint, run, "--lr", "1e-4")) == 0
    return run


def test_a_run_writes_its_settings_resolved_values_commit_and_environment(first_run):
    record = json.loads((first_run / "args.json").read_text())
    assert set(record) == {"args", "resolved", "git", "environment"}
    assert set(record["args"]) == {f.name for f in dataclasses.fields(TrainingArguments)}
    assert record["args"]["lr"] == 1e-4 and record["args"]["first_stages"] == "sst,qqp"
    assert record["args"]["prediction_files"]["sst_dev_out"] == str(first_run / "predictions" / "sst-dev-out.csv")
    # what was asked (auto) and what it became on this machine, apart
    assert record["args"]["precision"] == "auto" and record["resolved"]["precision"] in ("fp32", "bf16")
    assert record["resolved"]["device"] == "cpu" and record["resolved"]["world_size"] == 1
    assert record["environment"]["torch"] == torch.__version__ and record["environment"]["gpus"] == []
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert record["git"]["commit"] == head.stdout.strip() and isinstance(record["git"]["dirty"], bool)


def test_config_of_a_run_trains_it_again_byte_for_byte(first_run, tmp_path, monkeypatch):
    skip_figures(monkeypatch)
    second = tmp_path / "B"
    assert mc.main(["--config", str(first_run / "args.json"), "--output_dir", str(second)]) == 0
    # the CSVs followed --output_dir: the first run's were not written over
    for name in OUTPUTS:
        assert (second / "predictions" / name).read_bytes() == (first_run / "predictions" / name).read_bytes(), name
    for name in ("sst-dev.csv", "qqp-test.csv", "sts-dev.csv"):
        assert (second / "scores" / name).read_bytes() == (first_run / "scores" / name).read_bytes()

    def without_seconds(run):
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
                for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert without_seconds(second) == without_seconds(first_run)
    record = json.loads((second / "args.json").read_text())
    first = json.loads((first_run / "args.json").read_text())
    assert record["args"] == {**first["args"], "output_dir": str(second),
                              "prediction_files": {flag: path.replace(str(first_run), str(second))
                                                   for flag, path in first["args"]["prediction_files"].items()}}


def write_config(tmp_path, content) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    return str(path)


def test_flags_on_the_command_line_win_over_the_config(tmp_path):
    config = write_config(tmp_path, {"args": {"lr": 0.002, "batch_size": 4, "smart": True, "resume": True,
                                              "data_files": {"sst_train": "elsewhere/sst.csv"}},
                                     "resolved": {"precision": "fp32"}, "git": None, "environment": None})
    args = mc.parse_args(["--config", config, "--batch_size", "16", "--sst_dev", "mine.csv"])
    assert (args.lr, args.batch_size, args.smart) == (0.002, 16, True)
    assert args.data_files["sst_train"] == "elsewhere/sst.csv" and args.data_files["sst_dev"] == "mine.csv"
    assert args.resume is False  # resuming is the command line's choice, never a recipe's
    # a plain object of settings is a config too; an integer learning rate is a number as on the command line
    assert mc.parse_args(["--config", write_config(tmp_path, {"lr": 1, "patience": 3})]).lr == 1.0


def test_prediction_paths_given_on_the_command_line_stay_where_they_are(tmp_path):
    config = write_config(tmp_path, {"output_dir": "runs/A", "prediction_files": {
        "sst_dev_out": "runs/A/predictions/sst-dev-out.csv", "sts_test_out": "shared/sts-test-out.csv"}})
    args = mc.parse_args(["--config", config, "--output_dir", "runs/B", "--para_dev_out", "runs/A/mine.csv"])
    assert args.prediction_files["sst_dev_out"] == str(Path("runs/B/predictions/sst-dev-out.csv"))
    assert args.prediction_files["sts_test_out"] == "shared/sts-test-out.csv"  # outside the run's folder
    assert args.prediction_files["para_dev_out"] == "runs/A/mine.csv"  # the command line's


@pytest.mark.parametrize("content, problem", [
    ({"lrr": 0.1}, "unknown setting 'lrr'"),
    ({"args": {"lr": 0.1}, "notes": "x"}, "unknown key 'notes' in a run record"),
    ({"lr": "fast"}, "'lr' must be a number, found \"fast\""),
    ({"batch_size": 2.5}, "'batch_size' must be a whole number, found 2.5"),
    ({"epochs": True}, "'epochs' must be a whole number, found true"),
    ({"smart": "yes"}, "'smart' must be true or false, found \"yes\""),
    ({"schedule": "random"}, "'schedule' must be one of sequential, annealed, round_robin"),
    ({"max_train_examples": "all"}, "'max_train_examples' must be a whole number or null"),
    ({"lr": None}, "'lr' must be a number, found null"),
    ({"smart_override": "sst:adv_weight=2"}, "'smart_override' must be a list of strings"),
    ({"data_files": {"sst_training": "a.csv"}}, "'data_files' must be an object of paths (or null) by flag name"),
    ([1, 2], "expected a JSON object of settings by name, found list"),
    ({"lr": -1.0}, "--lr must be a finite number > 0"),  # values are checked as the flags' are
])
def test_a_bad_config_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, content, problem):
    config = write_config(tmp_path, content)
    assert exit_code(["--config", config]) == 2
    line = one_error_line(capsys)
    assert problem in line and (config in line or problem.startswith("--"))


@pytest.mark.parametrize("write, problem", [
    (None, "file not found"),
    (lambda path: path.write_text("{'lr': 1}"), "not a JSON file"),
    (lambda path: path.mkdir(), "not a regular file"),
])
def test_an_unreadable_config_is_one_line(tmp_path, capsys, write, problem):
    path = tmp_path / "config.json"
    if write:
        write(path)
    assert exit_code(["--config", str(path)]) == 2
    line = one_error_line(capsys)
    assert str(path) in line and problem in line


def test_the_commit_is_none_outside_a_checkout_or_without_git_and_says_dirty(tmp_path, monkeypatch):
    assert run_record.git_commit(tmp_path) is None  # not a checkout
    if subprocess.run(["git", "--version"], capture_output=True).returncode == 0:
        repo = tmp_path / "repo"
        repo.mkdir()
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        (repo / "a.py").write_text("x = 1\n")
        subprocess.run([*git, "add", "a.py"], check=True)
        subprocess.run([*git, "commit", "-qm", "a"], check=True)
        (repo / "untracked.txt").write_text("runs leave files")
        clean = run_record.git_commit(repo)
        assert clean["dirty"] is False and len(clean["commit"]) == 40
        (repo / "a.py").write_text("x = 2\n")
        assert run_record.git_commit(repo) == {**clean, "dirty": True}
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # git missing: the run goes on undescribed
    assert run_record.git_commit(ROOT) is None


# -- scripts/write_args_json.py ----------------------------------------------------------------------


def test_write_args_json_derives_a_record_that_trains_the_run_again(first_run, tmp_path, capsys):
    published = tmp_path / "results" / "group" / "A"
    published.mkdir(parents=True)
    for name in ("best.json", "history.json"):
        (published / name).write_text((first_run / name).read_text())
    undescribed = tmp_path / "results" / "history_only"
    undescribed.mkdir()
    (undescribed / "history.json").write_text("[]")
    assert write_args_json.main([str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "history_only: no saved settings" in out
    record = json.loads((published / "args.json").read_text())
    best = json.loads((first_run / "best.json").read_text())
    assert record["args"] == best["args"] and record["derived_from"] == "best.json"
    assert record["resolved"] is None and record["git"] is None
    assert not (undescribed / "args.json").exists()
    # what --config makes of it is the run's own settings
    args = mc.parse_args(["--config", str(published / "args.json")])
    assert dataclasses.asdict(args) == best["args"]


def test_write_args_json_names_the_settings_an_older_run_predates(tmp_path, capsys):
    run = tmp_path / "old"
    run.mkdir()
    old = {k: v for k, v in dataclasses.asdict(TrainingArguments()).items() if k not in ("patience", "report_to")}
    (run / "best.json").write_text(json.dumps({"args": old, "metrics": {}}))
    assert write_args_json.main([str(run)]) == 0
    assert json.loads((run / "args.json").read_text())["args"] == old
    assert "predates report_to, patience" in capsys.readouterr().out  # in the fields' order


@pytest.mark.slow
def test_the_demo_trained_again_from_its_args_json_writes_the_same_csvs(tmp_path, monkeypatch):
    skip_figures(monkeypatch)
    first, second = tmp_path / "A", tmp_path / "B"
    # One cycle of the demo's schedule (its first four stages, SMART included) keeps this slow test to half the time
    assert mc.main(["--demo", "--quiet", "--cycles", "1", *output_flags(first)]) == 0
    assert mc.main(["--config", str(first / "args.json"), "--output_dir", str(second)]) == 0
    for name in OUTPUTS:
        assert (second / "predictions" / name).read_bytes() == (first / "predictions" / name).read_bytes(), name
