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
        assert mc.main(run_flags(tiny_checkpoint, run, "--lr", "1e-4", "--departures", "batch 8 (the thesis: 32)")) == 0
    return run


def test_a_run_writes_its_settings_resolved_values_commit_and_environment(first_run):
    record = json.loads((first_run / "args.json").read_text())
    assert set(record) == {"args", "resolved", "git", "environment", "segments"}
    assert record["segments"] == [{"first_stage": 1, "resolved": record["resolved"]}]
    assert set(record["args"]) == {f.name for f in dataclasses.fields(TrainingArguments)}
    assert record["args"]["lr"] == 1e-4 and record["args"]["first_stages"] == "sst,qqp"
    assert record["args"]["departures"] == "batch 8 (the thesis: 32)"  # the note a study's arm passes
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
        return [{k: v for k, v in json.loads(line).items() if k not in ("seconds", "eval_seconds")}
                for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert without_seconds(second) == without_seconds(first_run)
    record = json.loads((second / "args.json").read_text())
    first = json.loads((first_run / "args.json").read_text())
    # every prediction path is this run's: those in the first run's folder at the same place, the unset ones (SQuAD's
    # defaults) unset, in each run's own predictions/
    assert record["args"] == {**first["args"], "output_dir": str(second),
                              "prediction_files": {flag: path and path.replace(str(first_run), str(second))
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


def test_a_rerun_writes_its_predictions_in_its_own_folder_never_the_first_runs(tmp_path, capsys):
    """Issue 44: the course's predictions/ (where --demo writes) is outside the run's folder; a rerun elsewhere wrote
    over the first run's six CSVs there."""
    config = write_config(tmp_path, {"args": {"output_dir": "runs/A", "prediction_files": {
        "sst_dev_out": "runs/A/predictions/sst-dev-out.csv", "sts_test_out": "shared/sts.csv",
        "sst_test_out": "predictions/sst-test-out.csv"}}})
    args = mc.parse_args(["--config", config, "--output_dir", "runs/B", "--para_dev_out", "runs/A/mine.csv"])
    assert args.prediction_files["sst_dev_out"] == str(Path("runs/B/predictions/sst-dev-out.csv"))
    # outside the recorded folder: the course's name inside this run's
    assert args.prediction_files["sts_test_out"] == str(Path("runs/B/predictions/sts-test-out.csv"))
    assert args.prediction_files["sst_test_out"] == str(Path("runs/B/predictions/sst-test-out.csv"))
    assert args.prediction_files["para_dev_out"] == "runs/A/mine.csv"  # the command line's
    note = capsys.readouterr().out
    assert "--sst_test_out, --sts_test_out" in note and str(Path("runs/B/predictions")) in note
    # the same folder is the same run: its paths stay
    assert mc.parse_args(["--config", config, "--output_dir", "runs/A"]).prediction_files["sts_test_out"] == \
        "shared/sts.csv"


def test_a_record_trained_again_in_its_own_folder_needs_the_folder_named(first_run, capsys):
    """Without --output_dir a run's args.json trained again into the run it records, removing its files."""
    record = str(first_run / "args.json")
    assert exit_code(["--config", record]) == 2
    line = one_error_line(capsys)
    assert record in line and "would replace" in line and "give --output_dir" in line
    assert mc.parse_args(["--config", record, "--output_dir", str(first_run)]).output_dir == str(first_run)
    assert mc.parse_args(["--config", record, "--resume"]).resume  # continuing it is the command line's choice


@pytest.mark.parametrize("content, problem", [
    ({"lrr": 0.1}, "unknown setting 'lrr' (settings are named as the flags without the dashes, the per-file flags "
                   "too, alone (\"sst_train\": PATH) or by field"),
    ({"sst_train": 3}, "'sst_train' must be a path (a string) or null, found 3"),
    ({"data_files": {"sst_train": "a.csv"}, "sst_train": "b.csv"}, "'sst_train' is set twice, alone and in "
                                                                   "'data_files'"),
    ({"args": {}, "segments": [1]}, "'segments' must be a list of objects"),
    ({"args": {"lr": 0.1}, "notes": "x"}, "unknown key 'notes' in a run record"),
    ({"lr": "fast"}, "'lr' must be a number, found \"fast\""),
    ({"batch_size": 2.5}, "'batch_size' must be a whole number, found 2.5"),
    ({"epochs": True}, "'epochs' must be a whole number, found true"),
    ({"smart": "yes"}, "'smart' must be true or false, found \"yes\""),
    ({"smart": None}, "'smart' must be true or false, found null"),  # a switch with a --no- form is no null
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
    args = mc.parse_args(["--config", str(published / "args.json"), "--output_dir", str(first_run)])
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
    # One cycle of the demo's schedule (its first four stages, SMART included) on 48 of each task's training
    # examples: the demo's settings and files, in a fraction of its time
    assert mc.main(["--demo", "--quiet", "--cycles", "1", "--max_train_examples", "48", *output_flags(first)]) == 0
    assert mc.main(["--config", str(first / "args.json"), "--output_dir", str(second)]) == 0
    for name in OUTPUTS:
        assert (second / "predictions" / name).read_bytes() == (first / "predictions" / name).read_bytes(), name


# -- what --config takes from a record, and what the command line decides (issue 44) -------------------------------


def test_a_resumed_run_records_each_segment_and_its_config_follows_the_command_line(tiny_checkpoint, tmp_path,
                                                                                    monkeypatch, capsys):
    skip_figures(monkeypatch)
    run = tmp_path / "A"
    assert mc.main(run_flags(tiny_checkpoint, run, "--precision", "fp32", "--stop_after_stages", "1")) == 0
    assert mc.main(run_flags(tiny_checkpoint, run, "--precision", "fp32", "--resume")) == 0
    record = json.loads((run / "args.json").read_text())
    assert [(s["first_stage"], s["resolved"]["precision"]) for s in record["segments"]] == [(1, "fp32"), (2, "fp32")]
    # a record resumed on another machine, where auto resolved otherwise: its rerun says it cannot repeat it ...
    record["segments"][0]["resolved"]["precision"] = "bf16"
    config = write_config(tmp_path, record)
    assert exit_code(["--config", config, "--output_dir", str(tmp_path / "B")]) == 2
    line = one_error_line(capsys)
    assert config in line and "changed the precision it resolved to when it resumed at stage 2 (\"bf16\" before, " \
        "\"fp32\" from then on)" in line and "give --precision to choose" in line
    # ... unless the command line chooses the precision (or its alias) for every stage
    for flags in (["--precision", "bf16"], ["--no-bf16"]):
        assert mc.parse_args(["--config", config, "--output_dir", str(tmp_path / "B"), *flags]).precision in \
            ("bf16", "fp32")


def test_segments_that_resolved_to_another_precision_or_are_not_described_are_refused(tmp_path, capsys):
    """`--precision auto` both times, but an L4 (bf16) then a T4 (fp16): the settings agree, what they made differs;
    a record whose earlier stages were not described cannot be repeated either."""
    for earlier, problem in [({"first_stage": 1, "resolved": {"precision": "bf16", "device": "cuda:0"}},
                              "changed the precision it resolved to when it resumed at stage 3"),
                             ({"first_stage": None, "resolved": None},
                              "without a record of how its earlier stages ran")]:
        later = {"first_stage": 3, "resolved": {"precision": "fp16", "device": "cuda:0"}}
        config = write_config(tmp_path, {"args": {"output_dir": str(tmp_path / "A")}, "segments": [earlier, later]})
        assert exit_code(["--config", config]) == 2
        assert problem in one_error_line(capsys)


def test_an_older_record_without_segments_becomes_the_first_segment_of_a_resumed_run(tmp_path):
    (tmp_path / "args.json").write_text(json.dumps({"args": {"precision": "bf16", "lr": 1e-3},
                                                    "resolved": {"precision": "bf16"}}))
    now = run_record.run_segments(tmp_path, True, 4, {"precision": "fp32"})
    assert now == [{"first_stage": None, "resolved": {"precision": "bf16"}},
                   {"first_stage": 4, "resolved": {"precision": "fp32"}}]
    (tmp_path / "args.json").write_text("{")  # unreadable: the earlier stages are described as unknown
    assert run_record.run_segments(tmp_path, True, 4, {})[0]["resolved"] is None
    assert run_record.run_segments(tmp_path, False, 1, {}) == [{"first_stage": 1, "resolved": {}}]


ONE_TASK = {"tasks": "sst", "first_stages": "sst", "cycle": "", "smart_tasks": "sst", "smart": True}


def test_settings_a_record_derived_from_its_tasks_follow_the_command_lines_tasks(tmp_path):
    """A one-task record trained with --tasks sst,qqp,sts kept its 'sst' stages: QQP's and STS's heads were never
    trained and their CSVs written from random weights."""
    args = mc.parse_args(["--config", write_config(tmp_path, ONE_TASK), "--tasks", "sst,qqp,sts"])
    assert (args.first_stages, args.cycle, args.smart_tasks) == ("qqp", "sts,sst,qqp:0.03", "sst,qqp,sts")
    # the demo's record (its short cycle) for one task: that task's stages
    demo = {"demo": True, "tasks": "sst,qqp,sts", "first_stages": "qqp", "cycle": "sts,sst,qqp:0.25"}
    args = mc.parse_args(["--config", write_config(tmp_path, demo), "--tasks", "sts"])
    assert (args.first_stages, args.cycle, args.smart_tasks) == ("sts", "", "sts")


@pytest.mark.parametrize("settings, tasks, problem", [
    # stages the record set itself, that train none of the new tasks
    ({**ONE_TASK, "first_stages": "sst*2", "cycle": "sst:0.5"}, "sst,qqp,sts",
     "the stages from --config CONFIG (--first_stages \"sst*2\", --cycle \"sst:0.5\") train no head of qqp, sts; give "
     "--first_stages and --cycle for these tasks"),
    # the sibling: SMART's tasks named by the record, one of them no longer among --tasks
    ({"tasks": "sst,qqp", "smart": True, "smart_tasks": "qqp"}, "sst", "(--smart_tasks from --config CONFIG)"),
])
def test_values_from_a_config_that_do_not_fit_the_command_lines_tasks_are_refused_saying_so(tmp_path, capsys, settings,
                                                                                             tasks, problem):
    config = write_config(tmp_path, settings)
    assert exit_code(["--config", config, "--tasks", tasks]) == 2
    assert problem.replace("CONFIG", config) in one_error_line(capsys)


@pytest.mark.parametrize("recorded, flags, precision", [
    ({"precision": "bf16", "bf16": True}, ["--precision", "fp32"], "fp32"),  # a --bf16 run's record
    ({"precision": "fp32", "bf16": False}, ["--bf16"], "bf16"),
    ({"precision": "bf16", "bf16": True}, ["--prec", "fp16"], "fp16"),  # abbreviated, as argparse allows
    ({"precision": "fp16"}, [], "fp16"),
])
def test_the_command_line_decides_an_alias_and_its_flag_together(tmp_path, recorded, flags, precision):
    assert mc.parse_args(["--config", write_config(tmp_path, recorded), *flags]).precision == precision


def test_a_config_that_contradicts_itself_is_refused_naming_it(tmp_path, capsys):
    config = write_config(tmp_path, {"precision": "fp16", "bf16": True})
    assert exit_code(["--config", config]) == 2
    assert one_error_line(capsys).endswith(f"--bf16 contradicts --precision fp16 (--bf16, --precision from --config "
                                           f"{config}) (see --help)")


def test_demo_in_a_config_applies_the_demos_settings_as_the_flag_does(tmp_path):
    config = write_config(tmp_path, {"demo": True, "lr": 1e-4})
    assert dataclasses.asdict(mc.parse_args(["--config", config])) == \
        dataclasses.asdict(mc.parse_args(["--demo", "--lr", "1e-4"]))
    args = mc.parse_args(["--config", config, "--tasks", "sst", "--batch_size", "4"])
    assert (args.pretrained, args.first_stages, args.cycle, args.batch_size) == ("minilm-l6", "sst", "", 4)


def test_per_file_flags_may_be_named_alone_in_a_config(tmp_path):
    args = mc.parse_args(["--config", write_config(tmp_path, {"sst_train": "a.csv", "sts_dev_out": "b.csv"})])
    assert args.data_files["sst_train"] == "a.csv" and args.prediction_files["sts_dev_out"] == "b.csv"


@pytest.mark.parametrize("damage", ["cut short", "a list", "not UTF-8", "args.json cut short", "not a number",
                                    "refused by the command line"])
def test_write_args_json_refuses_a_damaged_record_or_settings_config_would_refuse(tmp_path, capsys, damage):
    """One line naming the file, exit code 2, nothing written (each was a traceback, or an args.json of
    {"lr": "banana", "epochs": -5} that --config refuses: audit); the runs beside it are not half done."""
    good, run = tmp_path / "a_good", tmp_path / "b_run"
    good.mkdir(), run.mkdir()
    record = json.dumps({"args": dataclasses.asdict(TrainingArguments()), "metrics": {}})
    (good / "best.json").write_text(record)
    named = run / ("args.json" if damage == "args.json cut short" else "best.json")
    (run / "best.json").write_bytes({
        "cut short": record[:300].encode(), "a list": b"[1, 2]", "not UTF-8": b"\xff\xfe{}",
        "args.json cut short": record.encode(), "not a number": b'{"args": {"lr": "banana"}}',
        "refused by the command line": b'{"args": {"epochs": -5}}'}[damage])
    if damage == "args.json cut short":
        named.write_text(record[:20])
    assert write_args_json.main([str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: {named}: ")
    assert {"not a number": "'lr' must be a number", "refused by the command line": "--epochs must be >= 1"}.get(
        damage, "") in line
    assert not (good / "args.json").exists() and (damage == "args.json cut short") == (run / "args.json").exists()
