"""Calibration (minbert/tasks/calibration.py, minbert/reports/calibration.py, scripts/calibrate.py): the ECE against
hand-counted bins, temperature scaling recovering the temperature that made logits overconfident and lowering the
ECE, the threshold against a brute-force search, cross-fitting that never scores an example with a fit that saw it,
calibration.json read back or refused in one line, and a finished run's scores calibrated by the script."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from calibrate import main

from conftest import DEMO, ROOT
from minbert.data.batches import load_split
from minbert.data.scores import read_scores, scores_path, write_scores
from minbert.reports.calibration import calibration_lines, reliability_file, task_calibration, write_calibration
from minbert.tasks import TASKS
from minbert.tasks.base import decided
from minbert.tasks.calibration import (best_threshold, calibration_path, expected_calibration_error,
                                       fit_temperature, negative_log_likelihood, out_of_fold, read_calibration)
from minbert.tasks.course_files import read_rows
from minbert.tasks.score_files import ScoresFileError

pytestmark = pytest.mark.usefixtures("one_thread")


def two_classes(duplicate: list[float]) -> np.ndarray:
    return np.stack([1 - np.asarray(duplicate), np.asarray(duplicate)], axis=-1)


def test_ece_weighs_each_bins_gap_by_its_share_of_the_examples():
    # Ten at confidence 0.9 with nine right (no gap), ten at 0.65 with five right (gap 0.15): 0.5 x 0.15.
    probabilities = two_classes([0.9] * 10 + [0.65] * 10)
    gold = np.array([1] * 9 + [0] + [1] * 5 + [0] * 5)
    assert expected_calibration_error(probabilities, gold) == pytest.approx(0.075)
    # A confidence of 1 falls in the last bin, not past it; equal-width bins: 0.9 and 0.95 share one of 10.
    assert expected_calibration_error(two_classes([1.0, 1.0]), np.array([1, 0])) == pytest.approx(0.5)
    assert expected_calibration_error(two_classes([0.9, 0.95]), np.array([1, 1]), bins=10) == pytest.approx(0.075)


def overconfident(task: str, temperature: float, size: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from the task's probabilities of random logits, and those logits times `temperature`."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, (size, 5) if task == "sst" else size)  # SST's five logits, QQP's one
    probabilities = TASKS[task].outputs.probabilities(logits)
    gold = (rng.random(size)[:, None] > np.cumsum(probabilities, axis=-1)).sum(axis=-1)
    return logits * temperature, gold


@pytest.mark.parametrize("task", ["sst", "qqp"])
def test_temperature_scaling_undoes_an_overconfident_scale_and_lowers_the_ece(task):
    scores, gold = overconfident(task, 2.5)
    probabilities = TASKS[task].outputs.probabilities
    temperature = fit_temperature(probabilities, scores, gold)
    assert temperature == pytest.approx(2.5, rel=0.1)
    grid = np.exp(np.linspace(np.log(0.5), np.log(8), 801))  # the search finds the grid's minimum
    grid_best = grid[np.argmin([negative_log_likelihood(probabilities, scores, gold, t) for t in grid])]
    assert temperature == pytest.approx(grid_best, rel=0.01)
    entry, _ = task_calibration(TASKS[task], scores, gold)
    assert entry["nll_temperature"] < entry["nll"]
    assert entry["ece_temperature_cross_fitted"] < entry["ece"] / 3
    assert entry["ece_removed_interval"][0] > 0  # separable from noise at 4,000 examples
    assert ("threshold" in entry) == TASKS[task].has_threshold


def test_the_threshold_is_the_most_accurate_and_the_nearest_to_zero_among_ties():
    logits = np.array([-2.0, -1.0, 0.5, 0.8, 1.2, 2.0, 3.0])
    assert best_threshold(logits, np.array([0, 0, 0, 0, 1, 1, 1])) == pytest.approx(1.0)
    assert best_threshold(logits, np.array([0, 0, 1, 1, 1, 1, 1])) == 0.0  # every t in (-1, 0.5) ties: 0 is kept
    rng = np.random.default_rng(1)
    for _ in range(20):
        logits, gold = np.round(rng.normal(size=30), 1), rng.integers(0, 2, 30)  # rounded: repeated logits too
        accuracy = [np.mean((logits > t) == gold) for t in np.concatenate([logits, [logits.min() - 1]])]
        assert np.mean((logits > best_threshold(logits, gold)) == gold) == max(accuracy)


def test_cross_fitting_never_scores_an_example_with_a_fit_that_saw_it():
    folds = out_of_fold(lambda rows: set(rows.tolist()), lambda seen, rows: [row in seen for row in rows], 11)
    assert len(folds) == 5 and all(fold.shape == (11,) and not fold.any() for fold in folds)


def test_a_threshold_fitted_on_noise_gains_in_sample_but_not_cross_fitted():
    rng = np.random.default_rng(2)
    logits, gold = rng.normal(size=400), rng.integers(0, 2, 400)
    threshold = task_calibration(TASKS["qqp"], logits, gold)[0]["threshold"]
    assert threshold["accuracy_in_sample"] > threshold["accuracy_at_0"]
    assert threshold["accuracy_cross_fitted"] < threshold["accuracy_in_sample"]
    low, high = threshold["gain_interval"]
    assert low < 0 < high


def test_a_report_is_written_read_back_and_drawn(tmp_path):
    dev = {name: overconfident(name, 3.0, 300) for name in ("sst", "qqp")}
    dev["sts"] = (np.linspace(0, 5, 300), np.linspace(0, 5, 300))  # not calibrated: left out
    report = write_calibration(tmp_path, dev)
    assert list(report["tasks"]) == ["sst", "qqp"] and report["bins"] == 15
    assert json.loads(calibration_path(tmp_path).read_text()) == report
    assert {name: entry["temperature"] for name, entry in read_calibration(tmp_path).items()} == {
        name: entry["temperature"] for name, entry in report["tasks"].items()}
    for name in ("sst", "qqp"):
        assert (tmp_path / reliability_file(name)).read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / reliability_file("sts")).exists()
    lines = calibration_lines(report)
    assert len(lines) == 2 and "cross-fitted" in lines[0] and "threshold" in lines[1]


@pytest.mark.parametrize("content, problem", [
    (None, "no such file"),
    ("{", "not a calibration file"),
    ('{"tasks": {"sst": {"temperature": -1}}}', "sst's temperature must be a number > 0"),
    ('{"tasks": {"qqp": {"temperature": 1, "threshold": {"logit": "x"}}}}', "qqp's threshold must be"),
])
def test_a_bad_calibration_file_is_one_line_naming_it(tmp_path, content, problem):
    if content is not None:
        calibration_path(tmp_path).write_text(content)
    with pytest.raises(ScoresFileError, match=problem) as error:
        read_calibration(tmp_path)
    assert str(calibration_path(tmp_path)) in str(error.value) and "\n" not in str(error.value)


def demo_ids(task: str, split: str) -> list[str]:
    return [i for i, _, _ in read_rows(DEMO / TASKS[task].file_name(split), split, TASKS[task].text_columns,
                                       TASKS[task].label_column, TASKS[task].data.label_problem, task)]


def write_run_scores(run):
    rng = np.random.default_rng(3)
    for name in ("sst", "qqp"):
        for split in ("dev", "test"):
            ids = demo_ids(name, split)
            shape = (len(ids), 5) if name == "sst" else (len(ids),)
            write_scores(scores_path(run, name, split), ids, rng.normal(0, 4, shape), name)


def test_the_script_calibrates_a_finished_runs_scores_and_writes_thresholded_csvs(tmp_path, capsys):
    run = tmp_path / "run"
    write_run_scores(run)
    result = subprocess.run([sys.executable, "scripts/calibrate.py", str(run), "--data_dir", str(DEMO),
                             "--threshold_out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    fitted = read_calibration(run)
    assert set(fitted) == {"sst", "qqp"} and (run / reliability_file("qqp")).is_file()
    ids, scores = read_scores(scores_path(run, "qqp", "test"), "qqp")
    expected = tmp_path / "expected.csv"
    TASKS["qqp"].outputs.write_predictions(expected, ids, decided(TASKS["qqp"], scores, fitted["qqp"]["threshold"]["logit"])[1])
    assert (tmp_path / "out" / "para-test-out.csv").read_bytes() == expected.read_bytes()
    assert not (tmp_path / "out" / "sst-dev-out.csv").exists()  # SST has no threshold
    assert main([str(tmp_path / "out"), "--data_dir", str(DEMO)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no dev scores" in error


@pytest.mark.parametrize("where", ["own", "recorded", "other run"])
def test_threshold_out_never_writes_over_a_runs_csvs(tmp_path, capsys, where):
    """The run's own CSVs (in its predictions/, or where its best.json says its flags sent them) and another run's
    folder are refused in one line naming --threshold_out, before anything is written."""
    run, other = tmp_path / "run", tmp_path / "other"
    write_run_scores(run)
    recorded = {"para_dev_out": str(tmp_path / "mine" / "para-dev-out.csv")}
    (run / "best.json").write_text(json.dumps({"args": {"prediction_files": recorded}}))
    (other / "predictions").mkdir(parents=True)
    (other / "best.json").write_text("{}")
    folder = {"own": run / "predictions", "recorded": tmp_path / "mine", "other run": other / "predictions"}[where]
    folder.mkdir(exist_ok=True)
    (folder / "para-dev-out.csv").write_text("theirs")
    assert main([str(run), "--data_dir", str(DEMO), "--threshold_out", str(folder)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: --threshold_out {folder}") and error.count("\n") == 1
    assert (folder / "para-dev-out.csv").read_text() == "theirs" and not (run / "calibration.json").exists()


@pytest.mark.parametrize("threshold_out", [False, True])
def test_a_damaged_best_json_is_refused_naming_it_not_read_as_no_record(tmp_path, capsys, threshold_out):
    """A best.json cut short is no record: read as none, the CSVs it sent elsewhere lost --threshold_out's guard and
    were written over (audit); the run is refused in one line naming it, before anything is written."""
    run, mine = tmp_path / "run", tmp_path / "mine"
    write_run_scores(run)
    mine.mkdir()
    (mine / "para-dev-out.csv").write_text("theirs")
    record = json.dumps({"args": {"prediction_files": {"para_dev_out": str(mine / "para-dev-out.csv")}}})
    (run / "best.json").write_text(record[:30])
    flags = ["--threshold_out", str(mine)] if threshold_out else []
    assert main([str(run), "--data_dir", str(DEMO), *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {run / 'best.json'}: not JSON") and error.count("\n") == 1
    assert (mine / "para-dev-out.csv").read_text() == "theirs" and not (run / "calibration.json").exists()


def test_a_folder_without_best_json_is_calibrated(tmp_path):
    """An ensemble's folder has no best.json: nothing damaged, calibrated as before."""
    write_run_scores(tmp_path / "ensemble")
    assert main([str(tmp_path / "ensemble"), "--data_dir", str(DEMO)]) == 0
    assert (tmp_path / "ensemble" / "calibration.json").is_file()


def record_own_metrics(run):
    """A best.json recording the dev accuracy its scores decide (the run's own rule: the task's decide)."""
    metrics = {}
    for name in ("sst", "qqp"):
        ids, scores = read_scores(scores_path(run, name, "dev"), name)
        gold = {e.id: e.label for e in load_split(DEMO, name, "dev")}
        predicted = TASKS[name].model.decide(torch.from_numpy(scores)).numpy()
        metrics[TASKS[name].model.score_key] = float(np.mean(predicted == np.array([gold[i] for i in ids])))
    (run / "best.json").write_text(json.dumps({"metrics": metrics, "args": {"tasks": "sst,qqp"}}))


def test_dev_scores_copied_from_another_run_are_refused_before_anything_is_written(tmp_path, capsys):
    """Audit: calibrate.py fitted and wrote calibration.json and thresholded CSVs from a scores/qqp-dev.csv copied
    from another run. Decided as the run decided its CSVs, the dev scores must score what its best.json records."""
    run, other = tmp_path / "run", tmp_path / "other"
    write_run_scores(run)
    record_own_metrics(run)
    assert main([str(run), "--data_dir", str(DEMO), "--threshold_out", str(tmp_path / "own")]) == 0
    calibration_path(run).unlink()
    ids, scores = read_scores(scores_path(run, "qqp", "dev"), "qqp")
    write_scores(scores_path(other, "qqp", "dev"), ids, -scores, "qqp")  # another run's: every decision flipped
    scores_path(run, "qqp", "dev").write_bytes(scores_path(other, "qqp", "dev").read_bytes())
    capsys.readouterr()
    assert main([str(run), "--data_dir", str(DEMO), "--threshold_out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {scores_path(run, 'qqp', 'dev')}: its qqp_acc is ") and error.count("\n") == 1
    assert error.endswith(f"that {run / 'best.json'} records: not this run's dev scores\n")
    assert not calibration_path(run).exists() and not (tmp_path / "out").exists()
