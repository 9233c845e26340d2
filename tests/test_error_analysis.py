"""scripts/error_analysis.py: counts and plots of a run folder's dev CSVs against the gold dev files."""
import json
from pathlib import Path

import numpy as np
import pytest

import error_analysis

from conftest import DEMO
from evaluation import read_predictions, write_predictions
from minbert.data.batches import load_split
from minbert.tasks import MULTITASK, TASKS, default_output


def write_dev_csvs(folder: Path, sst_shift: int = 0, skip_qqp_rows: int = 0) -> None:
    """The gold dev labels as predictions, SST moved up by sst_shift classes (kept in 0..4)."""
    for task in MULTITASK:
        examples = load_split(DEMO, task, "dev")
        labels = [min(4, e.label + sst_shift) if task == "sst" else e.label for e in examples]
        if task == "qqp" and skip_qqp_rows:
            examples, labels = examples[skip_qqp_rows:], labels[skip_qqp_rows:]
        write_predictions(folder / Path(default_output(task, "dev")).name, [e.id for e in examples], labels, task)


def dev_metrics(folder: Path) -> dict[str, float]:
    """What a run whose dev CSVs are folder's records of them in best.json: each task's kept-model score."""
    metrics = {}
    for task in MULTITASK:
        predicted = read_predictions(folder / Path(default_output(task, "dev")).name, task)
        examples = [e for e in load_split(DEMO, task, "dev") if e.id in predicted]
        rows = np.array([[predicted[e.id] for e in examples], [e.label for e in examples]], dtype=float)
        metrics[TASKS[task].model.score_key] = float(TASKS[task].model.resampled_scores(rows[:1], rows[1:])[0])
    return metrics


def test_counts_and_plots_of_a_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    write_dev_csvs(run / "predictions", sst_shift=1)
    assert error_analysis.main([str(run), "--data_dir", str(DEMO)]) == 0
    out = capsys.readouterr().out.splitlines()
    sst = [e.label for e in load_split(DEMO, "sst", "dev")]
    right = sum(label == 4 for label in sst)  # only gold 4 stays right when every prediction moves up one class
    assert out[0].startswith(f"SST (predicted - gold class): {right} right, {len(sst) - right} off by 1 "
                             f"({len(sst) - right} too positive, 0 too negative)")
    assert "0 false positives, 0 false negatives" in out[1] and out[1].endswith("precision 1.000, recall 1.000")
    bins = [line for line in out if line.startswith("  gold ")]
    assert bins and all(line.endswith("mean absolute error 0.00") for line in bins)
    assert sorted(p.name for p in run.glob("*.png")) == [
        "qqp_confusion_matrix.png", "sst_error_histogram.png", "sts_scatter.png"]


def test_csvs_beside_the_plots_and_another_output_dir(tmp_path, capsys):
    write_dev_csvs(tmp_path / "ensemble")  # the ensemble folder holds its CSVs directly
    assert error_analysis.main([str(tmp_path / "ensemble"), "--data_dir", str(DEMO),
                                "--output_dir", str(tmp_path / "plots")]) == 0
    assert "0 off by 1" in capsys.readouterr().out
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3


def test_a_missing_prediction_is_one_line_naming_the_file(tmp_path, capsys):
    write_dev_csvs(tmp_path / "run", skip_qqp_rows=1)
    assert error_analysis.main([str(tmp_path / "run"), "--data_dir", str(DEMO)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {tmp_path / 'run' / 'para-dev-out.csv'}: 1 missing ids")
    assert not list((tmp_path / "run").glob("*.png"))


def test_an_output_dir_that_cannot_be_written_is_one_line(tmp_path, capsys):
    write_dev_csvs(tmp_path / "run")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert error_analysis.main([str(tmp_path / "run"), "--data_dir", str(DEMO), "--output_dir", str(blocker)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {blocker}: cannot write there, {blocker} is a file, not a folder"


def test_a_run_whose_csvs_went_elsewhere_is_read_where_its_flags_sent_them(tmp_path, capsys, monkeypatch):
    """A run told to write the course's predictions/ (as runs were by default before) wrote them beside where it
    started, not in runs/demo/: the run's best.json says where, and
    which data it read, so `error_analysis.py runs/demo` needs no other flag."""
    monkeypatch.chdir(tmp_path)
    write_dev_csvs(Path("predictions"), sst_shift=1)
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    written = {f"{flag}_dev_out": f"predictions/{flag}-dev-out.csv" for flag in ("sst", "para", "sts")}
    (run / "best.json").write_text(json.dumps({"metrics": dev_metrics(Path("predictions")),
                                               "args": {"data_dir": str(DEMO), "prediction_files": written}}))
    assert error_analysis.main([str(run)]) == 0
    assert "too positive" in capsys.readouterr().out
    assert len(list(run.glob("*.png"))) == 3


DEV_SST = len(load_split(DEMO, "sst", "dev"))


def started_in(folder: Path, output_dir: str, record_working_dir: bool) -> Path:
    """A run started in `folder` with relative flags (its CSVs in folder/predictions, SST right on every row);
    with `record_working_dir` its args.json says where it started. Returns the run's folder."""
    write_dev_csvs(folder / "predictions")
    run = folder / output_dir
    run.mkdir(parents=True)
    written = {f"{flag}_dev_out": f"predictions/{flag}-dev-out.csv" for flag in ("sst", "para", "sts")}
    settings = {"data_dir": "data", "output_dir": output_dir, "prediction_files": written}
    (run / "best.json").write_text(json.dumps({"metrics": dev_metrics(folder / "predictions"), "args": settings}))
    if record_working_dir:
        (run / "args.json").write_text(json.dumps({"args": settings, "resolved": {"working_dir": str(folder)}}))
    (folder / "data").symlink_to(DEMO)
    return run


def test_a_run_analysed_from_another_folder_reads_the_files_it_recorded_not_the_namesakes_there(
        tmp_path, capsys, monkeypatch):
    """Its recorded relative paths are relative to where it started: from elsewhere they once named that folder's
    files (here SST predictions one class off), analysed and drawn into the run's plots as if they were the run's."""
    run = started_in(tmp_path / "project", "runs/demo", record_working_dir=False)
    elsewhere = tmp_path / "elsewhere"
    write_dev_csvs(elsewhere / "predictions", sst_shift=1)
    monkeypatch.chdir(elsewhere)
    assert error_analysis.main([str(run)]) == 0
    assert capsys.readouterr().out.startswith(f"SST (predicted - gold class): {DEV_SST} right, 0 off by 1")


def test_a_moved_run_reads_the_files_where_its_args_json_says_it_started(tmp_path, capsys, monkeypatch):
    run = started_in(tmp_path / "project", "runs/demo", record_working_dir=True)
    moved = tmp_path / "archive" / "demo"
    moved.parent.mkdir()
    run.rename(moved)  # its recorded --output_dir no longer names where it is
    write_dev_csvs(tmp_path / "predictions", sst_shift=1)
    monkeypatch.chdir(tmp_path)
    assert error_analysis.main([str(moved)]) == 0
    assert capsys.readouterr().out.startswith(f"SST (predicted - gold class): {DEV_SST} right, 0 off by 1")


def test_the_plots_never_go_into_another_runs_folder(tmp_path, capsys):
    """Another run's folder holds that run's plots of the same names: refused in one line before anything is drawn;
    the run's own folder is the default."""
    write_dev_csvs(tmp_path / "run")
    other = tmp_path / "other"
    other.mkdir()
    (other / "best.json").write_text("{}")
    assert error_analysis.main([str(tmp_path / "run"), "--data_dir", str(DEMO), "--output_dir", str(other)]) == 2
    assert capsys.readouterr().err == (f"error: --output_dir {other}: inside the run folder {other.resolve()}, whose "
                                       "files belong to that run; write elsewhere\n")
    assert not list(other.glob("*.png"))


@pytest.mark.parametrize("damage", ["truncated", "not an object", "args not an object", "not UTF-8"])
def test_a_damaged_best_json_is_refused_naming_it_not_its_stale_csvs_analysed(tmp_path, capsys, damage):
    """A best.json that is there but unreadable is no run record: not the folder's stale CSVs analysed as the run's
    (nor a dev file the default --data_dir lacks named instead: audit)."""
    run = tmp_path / "run"
    write_dev_csvs(run)
    record = json.dumps({"args": {"data_dir": str(DEMO), "prediction_files": {}}}).encode()
    (run / "best.json").write_bytes({"truncated": record[:20], "not an object": b"[1, 2]",
                                     "args not an object": b'{"args": [1]}', "not UTF-8": b"\xff\xfe{}"}[damage])
    assert error_analysis.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'best.json'}: ") and err.count("\n") == 1
    assert not list(run.glob("*.png"))


def test_a_missing_run_folder_is_refused_naming_it(tmp_path, capsys):
    assert error_analysis.main([str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'gone'}: no such run folder\n"
    assert not (tmp_path / "gone").exists()


def test_csvs_another_run_wrote_over_the_runs_own_are_refused(tmp_path, capsys, monkeypatch):
    """Two runs sent their CSVs to the same paths (the handout's predictions/): the later one's sit there now, and
    the earlier run's best.json records other scores."""
    run = started_in(tmp_path / "project", "runs/first", record_working_dir=True)
    write_dev_csvs(tmp_path / "project" / "predictions", sst_shift=1)  # a second run's, at the same paths
    assert error_analysis.main([str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "sst-dev-out.csv: its sst_acc is" in err and err.endswith("records: not this run's predictions")
