"""The front page's figure (minbert/reports/study_plots.py, scripts/plot_studies.py): per-seed points and each arm's
interval, the exact permutation p deciding the verdict, on tiny hand-made values and run folders."""
import json
import shutil

import pytest

from minbert.reports.study_plots import SeedPanel, mean_interval, plot_seed_panels, seed_panel_rows
from scripts import plot_studies

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_panels_are_drawn_as_a_png(tmp_path):
    panels = [SeedPanel("bwt", {"none": [-0.05, -0.09, -0.07], "smart": [-0.03, -0.04, -0.02]}),
              SeedPanel("drop", {"none": [0.15, 0.16], "smart": [0.10, 0.09]}),
              SeedPanel("one arm", {"none": [0.1, 0.2]})]
    path = plot_seed_panels(panels, tmp_path / "studies.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_the_interval_is_over_the_runs_and_holds_the_mean():
    mean, low, high = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and 1.0 <= low < mean < high <= 4.0


def test_the_exact_test_decides_the_verdict_not_the_interval():
    """Three runs against three: every split is one of C(6, 3) = 20, so p >= 0.1 however far apart the arms are,
    while the bootstrap's interval (never beyond the runs drawn) excludes zero: the verdict must follow p."""
    panel = SeedPanel("score", {"none": [0.60, 0.61, 0.62], "smart": [0.70, 0.71, 0.72]})
    smart_row = seed_panel_rows(panel, baseline="none")[-1].split(" | ")
    assert smart_row[3].startswith("+0.100 [+") and float(smart_row[4]) == pytest.approx(0.1)
    assert smart_row[5].rstrip(" |") == "not separable"


def test_five_seeds_apart_are_separable_and_named_by_direction():
    panel = SeedPanel("drop", {"none": [0.15, 0.16, 0.17, 0.18, 0.19], "smart": [0.05, 0.06, 0.07, 0.08, 0.09]})
    assert seed_panel_rows(panel, baseline="none")[-1].endswith("| 0.008 | lower |")


def write_forgetting_run(folder, bwt_drop):
    """A sequential run: QQP, then STS, then SST; QQP loses bwt_drop by the end, STS nothing, so its backward
    transfer (the mean over QQP and STS) is -bwt_drop / 2."""
    history = [{"stage": "pretrained", "sst_acc": 0.2, "qqp_acc": 0.5, "sts_pearson": 0.8},
               {"stage": "qqp", "sst_acc": 0.2, "qqp_acc": 0.7, "sts_pearson": 0.8},
               {"stage": "sts", "sst_acc": 0.2, "qqp_acc": 0.7, "sts_pearson": 0.85},
               {"stage": "sst", "sst_acc": 0.4, "qqp_acc": 0.7 - bwt_drop, "sts_pearson": 0.85,
                "overall": 0.6 - bwt_drop}]
    history = [{**record, "index": index} for index, record in enumerate(history)]
    folder.mkdir(parents=True)
    (folder / "history.json").write_text(json.dumps(history))
    (folder / "best.json").write_text(json.dumps({"metrics": history[-1]}))  # the last stage kept


def write_robustness_run(folder, drop):
    rows = [{"task": "sts", "variant": "eps=0.01", "drop": {"value": drop}}]
    folder.mkdir(parents=True)
    (folder / "robustness.json").write_text(json.dumps({"settings": {}, "rows": rows}))


@pytest.fixture
def studies(tmp_path):
    forgetting, robustness = tmp_path / "forgetting", tmp_path / "robustness"
    for arm, base in (("none", 0.06), ("smart", 0.02)):
        for seed, name in enumerate([arm, f"{arm}_seed1", f"{arm}_seed2"]):
            write_forgetting_run(forgetting / name, base + 0.01 * seed)
            write_robustness_run(robustness / name, 3 * base + 0.01 * seed)
    write_forgetting_run(forgetting / "smart_seed1_copy", 0.5)  # not a seed of smart: left out
    return forgetting, robustness


def test_the_script_reads_each_arm_and_its_seeds(studies, tmp_path, capsys):
    forgetting, robustness = studies
    out = tmp_path / "figure.png"
    assert plot_studies.main(["--out", str(out), "--forgetting_dir", str(forgetting), "--robustness_dir",
                              str(robustness), "--arms", "none,smart", "--robustness_rows", "sts:eps=0.01"]) == 0
    printed = capsys.readouterr().out
    assert "| smart | -0.010, -0.015, -0.020 |" in printed  # backward transfer of the three seeds, in seed order
    assert "| smart | 0.060, 0.070, 0.080 |" in printed  # the STS drops
    assert out.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("flags, problem", [
    (["--robustness_rows", "sts"], "expected TASK:VARIANT"),
    (["--robustness_rows", "sts:eps=0.5"], "no row sts:eps=0.5"),
    (["--arms", "none,ewc"], "arm ewc: fewer than two runs (seeds) in the forgetting study's directory"),
    (["--out", "figure.svg"], "expected a .png path"),
])
def test_bad_input_is_one_line_and_exit_2(studies, tmp_path, capsys, flags, problem):
    forgetting, robustness = studies
    argv = ["--out", str(tmp_path / "f.png"), "--forgetting_dir", str(forgetting), "--robustness_dir",
            str(robustness), "--arms", "none,smart", *flags]
    try:
        code = plot_studies.main(argv)
    except SystemExit as stopped:
        code = stopped.code
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert problem in error and "\n" not in error
    assert not (tmp_path / "f.png").exists()


@pytest.mark.parametrize("damage, problem", [
    (lambda run, other: shutil.copy(other / "history.json", run / "history.json"),
     "history.json: not the history of best.json's kept model"),
    (lambda run, other: [(run / name).write_text((run / name).read_text().replace("0.7", "NaN"))
                         for name in ("history.json", "best.json")], "not a finite number (a damaged record)"),
])
def test_a_run_whose_history_is_not_its_own_is_refused(studies, tmp_path, capsys, damage, problem):
    forgetting, robustness = studies
    damage(forgetting / "smart", forgetting / "smart_seed1")
    argv = ["--out", str(tmp_path / "f.png"), "--forgetting_dir", str(forgetting), "--robustness_dir",
            str(robustness), "--arms", "none,smart", "--robustness_rows", "sts:eps=0.01"]
    assert plot_studies.main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert str(forgetting / "smart") in error and problem in error and "\n" not in error
