"""scripts/summarize_runs.py: the rows RESULTS.md quotes, on hand-made run folders."""
import json
from pathlib import Path

import pytest

import summarize_runs
from evaluation import overall_score


def record(index, stage, overall, sst, seconds):
    return {"index": index, "stage": stage, "seconds": seconds, "sst_acc": sst, "sst_f1_weighted": sst - 0.05,
            "qqp_acc": 0.8, "qqp_f1": 0.75, "sts_pearson": 0.85, "overall": overall}


def make_run(folder: Path, best_sst: float) -> Path:
    history = [record(0, "pretrained", 0.5, 0.2, 999.0), record(1, "qqp", 0.7, best_sst, 60.0),
               record(2, "sst", 0.6, 0.3, 120.0)]
    folder.mkdir()
    (folder / "history.json").write_text(json.dumps(history))
    (folder / "best.json").write_text(json.dumps({"metrics": history[1]}))
    return folder


def test_rows_and_mean_with_sample_std(tmp_path, capsys):
    runs = [make_run(tmp_path / "s1", 0.40), make_run(tmp_path / "s2", 0.50)]
    assert summarize_runs.main([str(r) for r in runs]) == 0
    lines = capsys.readouterr().out.splitlines()
    # The pretrained row's seconds are evaluation, not training: 60 s + 120 s = 3.0 min. Stages qqp then sst: QQP
    # is the earlier task, unchanged by the SST stage (BWT and forgetting 0); after it (0.3 + 0.8 + 0.85) / 3.
    assert lines[0].endswith("| best after | final overall | train min | avg score after last stage | BWT | "
                             "mean forgetting |")
    assert lines[2] == ("| s1 | 0.400 | 0.350 | 0.800 | 0.750 | 0.850 | 0.700 | stage 1 (qqp) | 0.600 | 3.0 | "
                        "0.650 | 0.000 | 0.000 |")
    assert lines[4].startswith("| mean ± std (2 runs) | 0.450 ± 0.071 | 0.400 ± 0.071 | 0.800 ± 0.000 |")
    assert lines[4].endswith("| 3.0 ± 0.0 | 0.650 ± 0.000 | 0.000 ± 0.000 | 0.000 ± 0.000 |")
    assert lines[5] == "s1, forgetting per earlier task (Chaudhry et al. 2018): qqp 0.0000"


def test_qqp_weighted_f1_and_the_continual_figures_of_a_sequential_run(tmp_path, capsys):
    def stage(index, name, sst, qqp, sts):
        return {"index": index, "stage": name, "seconds": 60.0, "sst_acc": sst, "sst_f1_weighted": sst - 0.01,
                "qqp_acc": qqp, "qqp_f1": qqp - 0.1, "qqp_f1_weighted": qqp - 0.02, "sts_pearson": sts,
                "overall": overall_score(sst, qqp, sts)}

    history = [stage(0, "pretrained", 0.2, 0.6, 0.8), stage(1, "qqp", 0.2, 0.8, 0.7), stage(2, "sts", 0.25, 0.75, 0.85),
               stage(3, "sst", 0.5, 0.7, 0.8)]
    run = tmp_path / "sequential"
    run.mkdir()
    (run / "history.json").write_text(json.dumps(history))
    (run / "best.json").write_text(json.dumps({"metrics": history[3]}))
    assert summarize_runs.main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| run | SST acc | SST F1 (w) | QQP acc | QQP F1 | QQP F1 (w) | STS r | overall |")
    # Earlier tasks qqp and sts: BWT ((0.70 - 0.80) + (0.80 - 0.85)) / 2; forgetting 0.10 and 0.05
    assert lines[2] == ("| sequential | 0.500 | 0.490 | 0.700 | 0.600 | 0.680 | 0.800 | 0.700 | stage 3 (sst) | 0.700 | "
                        "3.0 | 0.667 | -0.075 | 0.075 |")
    assert lines[3] == "sequential, forgetting per earlier task (Chaudhry et al. 2018): qqp 0.1000, sts 0.0500"


def test_a_one_task_run_gets_its_tasks_columns(tmp_path, capsys):
    """scripts/cpu_best_one_task.sh's runs: QQP alone, kept after its first rehearsal."""
    history = [{"index": 0, "stage": "pretrained", "seconds": 99.0, "qqp_acc": 0.5, "qqp_f1": 0.4},
               {"index": 1, "stage": "qqp", "seconds": 60.0, "qqp_acc": 0.81, "qqp_f1": 0.75},
               {"index": 2, "stage": "qqp@0.03", "seconds": 6.0, "qqp_acc": 0.83, "qqp_f1": 0.77},
               {"index": 3, "stage": "qqp@0.03", "seconds": 6.0, "qqp_acc": 0.82, "qqp_f1": 0.78}]
    run = tmp_path / "qqp_alone"
    run.mkdir()
    (run / "history.json").write_text(json.dumps(history))
    (run / "best.json").write_text(json.dumps({"metrics": history[2]}))
    assert summarize_runs.main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| run | QQP acc | QQP F1 | best after | final QQP acc | train min |"
    assert lines[2] == "| qqp_alone | 0.830 | 0.770 | stage 2 (qqp@0.03) | 0.820 | 1.2 |"


def test_unfinished_run_is_a_one_line_error_naming_the_file_and_exit_2(tmp_path, capsys):
    """Not Python's errno text ("[Errno 2] No such file or directory: ...") and exit code 1."""
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "history.json").write_text('[{"index": 0')
    for run, problem in (("empty", "no history.json"), ("torn", "history.json is not JSON: ")):
        with pytest.raises(SystemExit) as stopped:
            summarize_runs.main([str(tmp_path / run)])
        lines = capsys.readouterr().err.strip().splitlines()
        assert stopped.value.code == 2 and len(lines) == 1
        assert lines[0].startswith(f"error: {tmp_path / run}: not a finished run ({problem}")
        assert "Errno" not in lines[0]


def test_a_published_folder_without_checkpoints_keeps_the_first_best_stage(tmp_path, capsys):
    run = make_run(tmp_path / "published", 0.40)
    history = json.loads((run / "history.json").read_text())
    history.append(record(3, "sts", 0.7, 0.45, 60.0))  # ties the best overall later: the trainer keeps the first
    (run / "history.json").write_text(json.dumps(history))
    (run / "best.json").unlink()
    assert summarize_runs.main([str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[2].startswith("| published | 0.400 | 0.350 |")


def test_each_task_at_its_own_best_stage(tmp_path, capsys):
    run = make_run(tmp_path / "adapters", 0.40)
    history = json.loads((run / "history.json").read_text())
    history.append({**record(3, "sts", 0.65, 0.35, 60.0), "sts_pearson": 0.9, "qqp_acc": 0.7})
    (run / "history.json").write_text(json.dumps(history))
    assert summarize_runs.main([str(run), "--each_task_best"]) == 0
    # SST 0.40 after stage 1, QQP 0.80 first reached there too, STS 0.90 after stage 3 (the pretrained row never
    # counts): numbered as the trainer prints the stages and history.json's "index" holds them.
    assert capsys.readouterr().out.splitlines()[-1] == (
        "adapters, each task at its best stage: SST 0.400 (stage 1), QQP 0.800 (stage 1), STS 0.900 (stage 3): "
        "overall 0.7167")  # (0.40 + 0.80 + (0.90 + 1) / 2) / 3


def qa_record(index, stage, f1, seconds):
    return {"index": index, "stage": stage, "seconds": seconds, "qa_em": f1 - 0.1, "qa_f1": f1,
            "qa_has_answer_f1": f1 - 0.2, "qa_no_answer_f1": f1 + 0.2, "qa_f1_at_0": f1 - 0.05}


def test_a_squad_run_gets_the_squad_columns_and_a_four_task_run_both(tmp_path, capsys):
    qa_only = tmp_path / "qa"
    qa_only.mkdir()
    history = [qa_record(0, "pretrained", 0.5, 600.0), qa_record(1, "qa", 0.6, 60.0), qa_record(2, "qa", 0.55, 60.0)]
    (qa_only / "history.json").write_text(json.dumps(history))
    (qa_only / "best.json").write_text(json.dumps({"metrics": history[1]}))
    assert summarize_runs.main([str(qa_only)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("| run | SQuAD EM | SQuAD F1 | has-answer F1 | no-answer F1 | F1 at τ = 0 | best after | "
                        "final SQuAD F1 | train min |")
    assert lines[2] == "| qa | 0.500 | 0.600 | 0.400 | 0.800 | 0.550 | stage 1 (qa) | 0.550 | 2.0 |"
    four = tmp_path / "four"
    four.mkdir()
    history = [{**record(0, "pretrained", 0.5, 0.2, 1.0), **qa_record(0, "pretrained", 0.5, 1.0)},
               {**record(1, "multitask-1", 0.7, 0.45, 60.0), **qa_record(1, "multitask-1", 0.6, 60.0)}]
    (four / "history.json").write_text(json.dumps(history))
    (four / "best.json").write_text(json.dumps({"metrics": history[1]}))
    assert summarize_runs.main([str(four)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| run | SST acc |") and "| overall | SQuAD EM |" in lines[0]
    assert lines[2].endswith("| 0.700 | 0.500 | 0.600 | 0.400 | 0.800 | 0.550 | stage 1 (multitask-1) | 0.700 | 1.0 |")


def test_a_run_given_twice_is_refused_in_one_line(tmp_path, capsys):
    run = make_run(tmp_path / "s1", 0.40)
    assert summarize_runs.main([str(run), str(tmp_path / "." / "s1")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {tmp_path / '.' / 's1'} is the same run as {run}; give each run once"]


def test_runs_of_different_tasks_get_no_mean(tmp_path, capsys):
    three = make_run(tmp_path / "three", 0.40)
    four = make_run(tmp_path / "four", 0.45)
    history = [{**stage, **qa_record(stage["index"], stage["stage"], 0.6, stage["seconds"])}
               for stage in json.loads((four / "history.json").read_text())]
    (four / "history.json").write_text(json.dumps(history))
    (four / "best.json").write_text(json.dumps({"metrics": history[1]}))
    assert summarize_runs.main([str(three), str(four)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: four trained sst,qqp,sts,qa, three sst,qqp,sts: a mean over runs of different tasks mixes "
                   "their overall scores; summarize them apart"]


def test_two_runs_of_the_same_folder_name_each_keep_their_row(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    runs = [make_run(tmp_path / "a" / "seed", 0.40), make_run(tmp_path / "b" / "seed", 0.50)]
    assert summarize_runs.main([str(run) for run in runs]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| seed | 0.400 |") and lines[3].startswith(f"| {runs[1]} | 0.500 |")
    assert lines[4].startswith("| mean ± std (2 runs) | 0.450 ± 0.071 |")


def with_metric(best: dict, key: str, value) -> dict:
    return {**best, "metrics": {**best["metrics"], key: value}}


@pytest.mark.parametrize("damage, problem", [
    (lambda history, best: ([], best), "not a finished run (history.json has no trained stage)"),
    (lambda history, best: ([*history[:2], [2, "sst"]], best), "history.json is not a list of stage records"),
    (lambda history, best: ([*history[:2], {**history[2], "overall": float("inf")}], best),
     "history.json's record 2: overall is inf, not a finite number (a damaged record)"),
    (lambda history, best: (history, [1, 2]), "best.json holds no metrics of a kept model"),
    (lambda history, best: (history, {"metrics": [1, 2]}), "best.json holds no metrics of a kept model"),
    (lambda history, best: (history, with_metric(best, "sst_acc", "0.5")),
     "best.json's metrics: sst_acc is '0.5', not a finite number (a damaged record)"),
    (lambda history, best: (history, {"metrics": {k: v for k, v in best["metrics"].items() if k != "index"}}),
     "best.json's metrics: no stage label and index"),
    (lambda history, best: (history, with_metric(best, "sst_acc", float("nan"))),
     "best.json's metrics: sst_acc is nan, not a finite number (a damaged record)"),
    (lambda history, best: (history, with_metric(best, "index", 7)),
     "history.json is not the history of best.json's kept model (history.json has no stage 7)"),
])
@pytest.mark.parametrize("runs", [1, 2])
def test_a_damaged_record_is_one_line_naming_its_file_and_exit_2(tmp_path, capsys, damage, problem, runs):
    """Not a traceback (IndexError, TypeError, a format code's ValueError, KeyError, statistics' AttributeError over
    NaN), nor a NaN printed as a score; alone, or as one of the runs of a mean."""
    run = make_run(tmp_path / "damaged", 0.40)
    history, best = damage(json.loads((run / "history.json").read_text()), json.loads((run / "best.json").read_text()))
    (run / "history.json").write_text(json.dumps(history))
    (run / "best.json").write_text(json.dumps(best))
    others = [str(make_run(tmp_path / "intact", 0.50))] if runs == 2 else []
    with pytest.raises(SystemExit) as stopped:
        summarize_runs.main([str(run), *others])
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and captured.out == ""
    assert captured.err.splitlines() == [f"error: {run}: {problem}"]


def subset_run(folder: Path, seconds: float) -> Path:
    """A run of --max_eval_examples 100: its stages scored on a dev subset, best.json's metrics the kept model's on
    every dev example (Trainer.score_full_dev: its stage's record without dev_subset, with the full dev's scores)."""
    stages = ((0, "pretrained", 0.5, 0.2), (1, "qqp", 0.7, 0.4), (2, "sst", 0.6, 0.3))
    history = [{**record(*stage, seconds), "dev_subset": 100} for stage in stages]
    folder.mkdir()
    (folder / "history.json").write_text(json.dumps(history))
    (folder / "best.json").write_text(json.dumps({"metrics": record(1, "qqp", 0.71, 0.42, seconds)}))
    return folder


@pytest.mark.parametrize("subset", [False, True])
def test_another_runs_history_is_refused_naming_both_files(tmp_path, capsys, subset):
    """X's history.json replaced by Y's: X's kept model beside Y's final score, minutes and forgetting in one row.
    Under --max_eval_examples the kept model's dev scores are the full dev's, so its stage's other fields decide."""
    if subset:
        x, y = subset_run(tmp_path / "x", 60.0), subset_run(tmp_path / "y", 61.0)
    else:
        x, y = make_run(tmp_path / "x", 0.40), make_run(tmp_path / "y", 0.50)
    assert summarize_runs.main([str(x), str(y)]) == 0
    assert capsys.readouterr().out.splitlines()[2].startswith(f"| x | {'0.420' if subset else '0.400'} |")
    (x / "history.json").write_text((y / "history.json").read_text())
    with pytest.raises(SystemExit) as stopped:
        summarize_runs.main([str(x)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {x}: history.json is not the history of best.json's kept model (history.json's stage 1 differs "
        f"in {'seconds' if subset else 'sst_acc'})"]
