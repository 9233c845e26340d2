"""minbert/reports/bootstrap.py and scripts/compare_runs.py: bootstrap intervals of dev scores and paired
differences between configurations, from runs' saved dev predictions."""
import json

import numpy as np
import pytest
from scipy import stats

import compare_runs
from conftest import DEMO
from minbert.data.batches import load_split
from minbert.reports.bootstrap import OVERALL, Arm, compare, run_scores
from minbert.run.run_outputs import predictions_and_gold
from minbert.tasks import MULTITASK, PART1_TASKS, TASKS


def demo_run(tmp_path, name: str, flip: float, seed: int):
    """A run's folder whose dev CSVs get the demo's gold labels wrong on about `flip` of the examples."""
    generator = np.random.default_rng(seed)
    folder = tmp_path / name
    for task in MULTITASK:
        examples = load_split(DEMO, task, "dev")
        gold = np.array([e.label for e in examples], dtype=float)
        wrong = generator.random(len(gold)) < flip
        if TASKS[task].num_classes:
            predicted = np.where(wrong, (gold + 1) % TASKS[task].num_classes, gold).astype(int)
        else:
            predicted = np.clip(gold + wrong * generator.normal(0, 2.5, len(gold)), 0, 5)
        TASKS[task].outputs.write_predictions(folder / "predictions" / f"{TASKS[task].flag_prefix}-dev-out.csv",
                                      [e.id for e in examples], predicted.tolist())
    return folder


def arm(name: str, runs: list) -> Arm:
    return Arm(name, [{task: (np.asarray(p, float), np.asarray(g, float)) for task, (p, g) in run.items()}
                      for run in runs])


def synthetic_run(generator, accuracy: float, n: int = 400) -> dict:
    run = {}
    for task in MULTITASK:
        if TASKS[task].num_classes:
            gold = generator.integers(0, TASKS[task].num_classes, n)
            right = generator.random(n) < accuracy
            run[task] = (np.where(right, gold, (gold + 1) % TASKS[task].num_classes), gold)
        else:
            gold = generator.uniform(0, 5, n)
            run[task] = (gold + generator.normal(0, 3 * (1 - accuracy), n), gold)
    return run


def test_resampled_scores_are_the_tasks_own_metrics_row_by_row():
    generator = np.random.default_rng(0)
    predictions, gold = generator.integers(0, 5, (3, 50)), generator.integers(0, 5, (3, 50))
    assert TASKS["sst"].model.resampled_scores(predictions, gold) == pytest.approx((predictions == gold).mean(axis=1))
    x, y = generator.normal(size=(3, 50)), generator.normal(size=(3, 50))
    assert TASKS["sts"].model.resampled_scores(x, y) == pytest.approx([stats.pearsonr(a, b)[0] for a, b in zip(x, y)])
    assert TASKS["sts"].model.resampled_scores(np.ones((1, 5)), y[:1, :5]).tolist() == [0.0]  # constant: 0, as sts_metrics
    with pytest.raises(TypeError, match="qa: its score has no resampled form"):
        TASKS["qa"].model.resampled_scores(x, y)


def test_the_overall_score_is_the_courses():
    run = synthetic_run(np.random.default_rng(1), 0.7)
    scores = {key: value[0] for key, value in run_scores(run, MULTITASK).items()}
    assert scores[OVERALL] == pytest.approx((scores["sst"] + scores["qqp"] + (scores["sts"] + 1) / 2) / 3)


def test_an_arm_against_itself_is_not_separable_and_a_clearly_better_one_is():
    generator = np.random.default_rng(2)
    weak = [synthetic_run(generator, 0.55) for _ in range(3)]
    strong = [{task: (gold, gold) if TASKS[task].num_classes else (gold + 0.1 * generator.normal(size=len(gold)),
                                                                   gold)
               for task, (_, gold) in run.items()} for run in weak]  # the same examples, (nearly) all right
    result = compare([arm("weak", weak), arm("same", weak), arm("strong", strong)], MULTITASK, replicates=300)
    for key in (*MULTITASK, OVERALL):
        same, better = result.differences["same"][key], result.differences["strong"][key]
        # its runs are drawn apart from the baseline's (seeds are not paired), its examples with them
        assert same.value == 0 and not same.separable and same.p > 0.2
        assert better.separable and better.value > 0 and better.p < 0.01
        estimate = result.scores["weak"][key]
        assert estimate.low <= estimate.value <= estimate.high


def test_one_run_against_itself_differs_by_nothing_in_every_replicate():
    run = synthetic_run(np.random.default_rng(4), 0.6)
    result = compare([arm("a", [run]), arm("b", [run])], MULTITASK, replicates=200)
    assert {(d.value, d.low, d.high, d.p, d.separable) for d in result.differences["b"].values()} == {
        (0, 0, 0, 1, False)}


def test_seeds_widen_an_arms_interval_and_the_draws_repeat():
    generator = np.random.default_rng(3)
    runs = [synthetic_run(generator, accuracy) for accuracy in (0.5, 0.7, 0.9)]  # seeds that disagree a lot
    one, three = (compare([arm("a", chosen)], MULTITASK, replicates=400, seed=5) for chosen in (runs[1:2], runs))
    width = {name: r.scores["a"][OVERALL].high - r.scores["a"][OVERALL].low for name, r in (("one", one),
                                                                                              ("three", three))}
    assert width["three"] > 2 * width["one"]
    assert compare([arm("a", runs)], MULTITASK, replicates=400, seed=5) == three


def test_the_script_compares_run_folders(tmp_path, capsys):
    good = ",".join(str(demo_run(tmp_path, f"good{s}", 0.1, s)) for s in range(2))
    bad = ",".join(str(demo_run(tmp_path, f"bad{s}", 0.6, s)) for s in range(2))
    assert compare_runs.main(["--data_dir", str(DEMO), "--replicates", "200", f"bad={bad}", f"good={good}"]) == 0
    out = capsys.readouterr().out
    assert "| bad | 2 |" in out and "| good | 2 |" in out and "good - bad (paired over the same dev examples)" in out
    overall = next(line for line in out.splitlines() if line.startswith("| overall |"))
    assert overall.endswith("| survives (higher) |")


def test_bad_arms_are_refused_in_one_line(tmp_path, capsys):
    run = demo_run(tmp_path, "run", 0.1, 0)
    (run / "predictions" / "sts-dev-out.csv").unlink()
    assert compare_runs.main(["--data_dir", str(DEMO), str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "sts-dev-out.csv: file not found" in err[0]
    for argv, problem in [([f"a={run}", f"a={run}"], "'a' names two arms"),
                          ([str(tmp_path / "nope")], "nope: not a run's folder"),
                          (["--replicates", "10", str(run)], "--replicates must be >= 100"),
                          (["--replicates", str(10**9), str(run)], "--replicates must be <= 100000")]:
        with pytest.raises(SystemExit) as exit_info:
            compare_runs.main(["--data_dir", str(DEMO), *argv])
        assert exit_info.value.code == 2 and problem in capsys.readouterr().err


def part1_predictions(tmp_path, name: str, option: str, flip: float, seed: int):
    """classifier.py's --predictions_dir of one --option, wrong on about `flip` of the demo's dev examples."""
    generator = np.random.default_rng(seed)
    folder = tmp_path / name
    for task in PART1_TASKS:
        examples = load_split(DEMO, task, "dev")
        gold = np.array([e.label for e in examples])
        predicted = np.where(generator.random(len(gold)) < flip, (gold + 1) % TASKS[task].num_classes, gold)
        TASKS[task].outputs.write_predictions(folder / f"{option}-{task}-dev-out.csv", [e.id for e in examples],
                                      predicted.tolist())
    return folder


def test_the_script_compares_part1_runs_by_their_accuracies(tmp_path, capsys):
    frozen = [part1_predictions(tmp_path, f"pretrain_s{s}", "pretrain", 0.6, s) for s in range(2)]
    tuned = [part1_predictions(tmp_path, f"finetune_s{s}", "finetune", 0.1, s) for s in range(2)]
    assert compare_runs.main(["--part1", "--data_dir", str(DEMO), "--replicates", "200",
                              "frozen=" + ",".join(map(str, frozen)), "tuned=" + ",".join(map(str, tuned))]) == 0
    out = capsys.readouterr().out
    assert "| arm | runs | SST acc | CFIMDB acc |" in out and "overall" not in out
    accuracy = np.mean([np.mean(predicted == gold) for predicted, gold in
                        (run["cfimdb"] for run in compare_runs.read_arm("t", tuned, DEMO, part1=True).runs)])
    tuned_row = next(line for line in out.splitlines() if line.startswith("| tuned | 2 |"))
    assert tuned_row.split(" | ")[3].startswith(f"{accuracy:.4f} [")  # the mean of the two runs' accuracies
    assert next(line for line in out.splitlines() if line.startswith("| CFIMDB acc |")).endswith(
        "| survives (higher) |")
    part1_predictions(tmp_path, "pretrain_s0", "finetune", 0.1, 0)  # a second option's files in the same folder
    assert compare_runs.main(["--part1", "--data_dir", str(DEMO), str(frozen[0])]) == 2
    assert "expected one OPTION-sst-dev-out.csv (classifier.py's), found 2" in capsys.readouterr().err


def write_history(run, qqp_after_sst: float, dev_subset: int | None = None, first_subset: int | None = -1) -> None:
    """A sequential run's history: QQP then SST, QQP at 0.8 after its own stage and `qqp_after_sst` at the end;
    the stages scored on every dev example, or on --max_eval_examples' `dev_subset` (the first stage on
    `first_subset` where given)."""
    stages = [("qqp", 0.2, 0.8, 0.8), ("sst", 0.5, qqp_after_sst, 0.8)]
    subsets = [dev_subset if first_subset == -1 else first_subset, dev_subset]
    history = [{"stage": stage, "index": i + 1, "sst_acc": sst, "qqp_acc": qqp, "sts_pearson": sts,
                **({"dev_subset": subset} if subset is not None else {})}
               for i, ((stage, sst, qqp, sts), subset) in enumerate(zip(stages, subsets))]
    (run / "history.json").write_text(json.dumps(history))


def write_best(run, tasks: str = "sst,qqp,sts", scored=None, **args) -> None:
    """The run's best.json: its --tasks, the kept model's dev metrics of the CSVs in `scored` (default its own), and
    any other `args` (prediction_files)."""
    pairs = predictions_and_gold(scored or run, DEMO)
    scores = run_scores({task: (np.asarray(p, float), np.asarray(g, float)) for task, (p, g) in pairs.items()},
                        MULTITASK)
    metrics = {TASKS[task].model.score_key: float(scores[task][0]) for task in MULTITASK if task in tasks.split(",")}
    (run / "best.json").write_text(json.dumps({"metrics": metrics, "args": {"tasks": tasks, **args}}))


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    return err[0]


def test_a_run_whose_recorded_csvs_now_hold_another_runs_predictions_is_refused(tmp_path, capsys):
    ours, theirs = demo_run(tmp_path, "ours", 0.1, 0), demo_run(tmp_path, "theirs", 0.4, 1)
    write_best(ours)
    assert compare_runs.main(["--data_dir", str(DEMO), "--replicates", "100", str(ours)]) == 0  # its own: read
    capsys.readouterr()
    # Both runs sent their CSVs to the same paths; the later one's predictions sit there now.
    shared = {f"{prefix}_dev_out": str(theirs / "predictions" / f"{prefix}-dev-out.csv")
              for prefix in (TASKS[task].flag_prefix for task in MULTITASK)}
    write_best(ours, prediction_files=shared, scored=ours)
    assert compare_runs.main(["--data_dir", str(DEMO), "--replicates", "100", str(ours)]) == 2
    line = one_error_line(capsys)
    assert str(theirs / "predictions" / "sst-dev-out.csv") in line and "not this run's predictions" in line
    ensemble = demo_run(tmp_path, "ensemble", 0.1, 2)  # scripts/ensemble.py's folder records its dev metrics too
    write_best(ensemble, scored=theirs)
    record = json.loads((ensemble / "best.json").read_text())
    (ensemble / "best.json").unlink()
    (ensemble / "ensemble.json").write_text(json.dumps({"dev": record["metrics"], "tasks": dict.fromkeys(MULTITASK)}))
    assert compare_runs.main(["--data_dir", str(DEMO), "--replicates", "100", str(ensemble)]) == 2
    assert f"that {ensemble / 'ensemble.json'} records: not this run's predictions" in one_error_line(capsys)


def _sts_scores_barely_spread(run, recorded: float | None = None) -> None:
    """The run's STS CSV rewritten with scores spread over 0.01 (its 6 significant digits then round r by more than
    1e-6), and best.json recording r of the unrounded scores (or `recorded`)."""
    examples = load_split(DEMO, "sts", "dev")
    gold = np.array([e.label for e in examples], dtype=float)
    unrounded = 2.5 + 0.002 * gold + np.random.default_rng(0).normal(0, 0.002, len(gold))
    TASKS["sts"].outputs.write_predictions(run / "predictions" / "sts-dev-out.csv", [e.id for e in examples],
                                           unrounded.tolist())
    write_best(run)
    record = json.loads((run / "best.json").read_text())
    rounded = record["metrics"]["sts_pearson"]
    record["metrics"]["sts_pearson"] = float(stats.pearsonr(unrounded, gold)[0]) if recorded is None else recorded
    assert recorded is not None or abs(rounded - record["metrics"]["sts_pearson"]) > 1e-6  # what the test is about
    (run / "best.json").write_text(json.dumps(record))


def test_a_runs_own_csv_is_read_whatever_its_rounding_moved_the_score(tmp_path, capsys):
    run = demo_run(tmp_path, "narrow", 0.1, 0)
    _sts_scores_barely_spread(run)
    assert compare_runs.main(["--data_dir", str(DEMO), "--replicates", "100", str(run)]) == 0, capsys.readouterr().err


def test_a_recorded_score_that_is_not_a_number_matches_no_csv(tmp_path, capsys):
    run = demo_run(tmp_path, "nan", 0.1, 0)
    _sts_scores_barely_spread(run, recorded=float("nan"))
    assert compare_runs.main(["--data_dir", str(DEMO), "--replicates", "100", str(run)]) == 2
    assert "its sts_pearson is" in one_error_line(capsys)


def test_a_run_is_not_credited_with_a_task_it_did_not_train(tmp_path, capsys):
    run = demo_run(tmp_path, "sst_alone", 0.1, 0)  # the other tasks' CSVs left over from elsewhere
    write_best(run, tasks="sst")
    assert compare_runs.main(["--data_dir", str(DEMO), str(run)]) == 2
    assert "sst_alone: trained sst (best.json), not qqp: no qqp predictions of its own" in one_error_line(capsys)


def test_an_arm_gives_each_run_once_and_averages_runs_of_the_same_tasks(tmp_path, capsys):
    first, second = demo_run(tmp_path, "first", 0.1, 0), demo_run(tmp_path, "second", 0.1, 1)
    write_best(first)
    write_best(second, tasks="sst,qqp,sts,qa")
    with pytest.raises(SystemExit) as exit_info:  # the same folder, spelled another way
        compare_runs.main(["--data_dir", str(DEMO), f"a={first},{tmp_path / '.' / 'first'}"])
    assert exit_info.value.code == 2 and f"is the same run as {first}; give each run once" in capsys.readouterr().err
    assert compare_runs.main(["--data_dir", str(DEMO), f"a={first},{second}"]) == 2
    assert (f"a: {second} trained sst,qqp,sts,qa, {first} sst,qqp,sts: an arm averages runs of the same tasks"
            in one_error_line(capsys))


def test_two_arms_of_the_same_runs_are_refused(tmp_path, capsys):
    """Each difference of an arm from itself is 0 by construction: the same runs, however spelled and ordered."""
    first, second = demo_run(tmp_path, "first", 0.1, 0), demo_run(tmp_path, "second", 0.1, 1)
    with pytest.raises(SystemExit) as exit_info:
        compare_runs.main(["--data_dir", str(DEMO), f"a={first},{second}", f"b={second},{tmp_path / '.' / 'first'}"])
    assert exit_info.value.code == 2
    assert "arms: b names the same runs as a; an arm compared with itself differs by exactly 0" in \
        capsys.readouterr().err


def test_the_declared_primary_score_is_decided_over_the_seeds_and_the_rest_is_holm_corrected(tmp_path, capsys):
    good = ",".join(str(demo_run(tmp_path, f"good{s}", 0.1, s)) for s in range(2))
    bad = ",".join(str(demo_run(tmp_path, f"bad{s}", 0.6, s)) for s in range(2))
    argv = ["--data_dir", str(DEMO), "--replicates", "200", f"bad={bad}", f"good={good}"]
    assert compare_runs.main([*argv, "--primary", "overall"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Two runs against two: C(4, 2) = 6 splits, so the exact p is at least 2/6 however far apart the runs are.
    assert lines[0].startswith("Primary comparison (declared: --primary overall;")
    assert lines[1].startswith("good - bad, overall (2 against 2 runs): +0.33") and lines[1].endswith(
        "exact p 0.333: not separable")
    assert "Secondary comparisons: a family of 3, Holm-corrected" in lines[3]
    assert next(line for line in lines if line.startswith("| overall |")).endswith("| — | primary (above) |")
    assert next(line for line in lines if line.startswith("| SST acc |")).endswith("| survives (higher) |")
    assert compare_runs.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "No primary comparison declared (--primary): every comparison below is secondary."
    assert "a family of 4" in lines[2]


@pytest.mark.parametrize("primary, problem", [
    ("none:overall", "--primary: 'none' is not one of the later arms (kept)"),
    ("accuracy", "--primary: 'accuracy' is none of bwt, forgetting, sst, qqp, sts, overall"),
    ("kept:bwt", "--primary: none has one run; the exact test over seeds needs two runs or more in each arm"),
])
def test_an_impossible_primary_is_refused_in_one_line(tmp_path, capsys, primary, problem):
    none, kept = demo_run(tmp_path, "none", 0.3, 0), [demo_run(tmp_path, f"kept{s}", 0.3, s) for s in range(2)]
    with pytest.raises(SystemExit) as exit_info:
        compare_runs.main(["--data_dir", str(DEMO), f"none={none}", "kept=" + ",".join(map(str, kept)),
                           "--primary", primary])
    assert exit_info.value.code == 2 and problem in capsys.readouterr().err


def test_sequential_runs_get_their_forgetting_compared_over_the_seeds(tmp_path, capsys):
    none = [demo_run(tmp_path, f"none{s}", 0.3, s) for s in range(4)]
    kept = [demo_run(tmp_path, f"kept{s}", 0.3, 10 + s) for s in range(4)]
    for s, run in enumerate(none):
        write_history(run, 0.6 - 0.01 * s)  # forgets about 0.2 of QQP: BWT -0.2
    for s, run in enumerate(kept):
        write_history(run, 0.79 - 0.01 * s)  # forgets about 0.01
    argv = ["--data_dir", str(DEMO), "--replicates", "200", "none=" + ",".join(map(str, none)),
            "kept=" + ",".join(map(str, kept)), "--primary", "bwt"]
    assert compare_runs.main(argv) == 0
    out = capsys.readouterr().out
    assert "| none | 4 | -0.2150 ± 0.0129 | +0.2150 ± 0.0129 |" in out
    # 4 against 4: C(8, 4) = 70 splits, the two most extreme of them: p = 2/70, below 0.05: the primary decides
    assert out.splitlines()[1] == ("kept - none, bwt (4 against 4 runs): +0.1900 [+0.1750, +0.2050], exact p 0.029: "
                                   "higher")
    bwt = next(line for line in out.splitlines() if line.startswith("| kept | BWT |"))
    assert bwt.startswith("| kept | BWT | +0.1900") and bwt.endswith("| 0.029 | — | primary (above) |")
    # the same p as a secondary comparison, one of a family of five (four kept-model scores): Holm p 5 * 2/70
    forgetting = next(line for line in out.splitlines() if line.startswith("| kept | mean forgetting |"))
    assert forgetting.endswith("| 0.029 | 0.143 | not separable |")
    assert "The arms' stages were scored on different dev examples" not in out
    assert out.count(" | every dev example |") == 2
    for run in kept:  # scored between stages on --max_eval_examples' subsets: the table says so
        write_history(run, 0.79, dev_subset=2000)
    assert compare_runs.main(argv) == 0
    out = capsys.readouterr().out
    assert "| kept | 4 | -0.0100 ± 0.0000 | +0.0100 ± 0.0000 | at most 2000 dev examples a task |" in out
    assert "The arms' stages were scored on different dev examples" in out
    write_history(kept[0], 0.79)  # an arm mixing the two is refused in one line
    assert compare_runs.main(argv) == 2
    assert "an arm's runs must score their stages on the same dev examples" in one_error_line(capsys)
    write_history(kept[0], 0.79, dev_subset=2000, first_subset=None)  # and so is a run whose stages differ
    assert compare_runs.main(argv) == 2
    assert one_error_line(capsys).endswith("kept0/history.json: its stages were scored on different dev examples: "
                                           "at most 2000 dev examples a task and every dev example")
    for s, run in enumerate(kept):
        write_history(run, 0.79 - 0.01 * s)
    (none[0] / "history.json").unlink()  # a run without a sequential history: no such table, no primary BWT
    assert compare_runs.main(argv) == 2
    assert "--primary bwt: none's runs are not all sequential ones" in one_error_line(capsys)
    assert compare_runs.main(argv[:-2]) == 0 and "Forgetting over seeds" not in capsys.readouterr().out


def test_a_run_whose_history_is_another_runs_is_refused(tmp_path, capsys):
    """Its forgetting figures would be the other run's: history.json must hold best.json's record of the kept model."""
    arms = {name: [demo_run(tmp_path, f"{name}{s}", 0.3, 10 * i + s) for s in range(2)]
            for i, name in enumerate(("none", "kept"))}
    for runs in arms.values():
        for s, run in enumerate(runs):
            write_history(run, 0.7 - 0.05 * s)
            write_best(run)  # the last stage kept: its record in both files
            history, best = json.loads((run / "history.json").read_text()), json.loads((run / "best.json").read_text())
            history[-1] = best["metrics"] = {**history[-1], **best["metrics"]}
            (run / "history.json").write_text(json.dumps(history))
            (run / "best.json").write_text(json.dumps(best))
    argv = ["--data_dir", str(DEMO), "--replicates", "100", *(f"{name}=" + ",".join(map(str, runs))
                                                              for name, runs in arms.items())]
    assert compare_runs.main(argv) == 0 and "Forgetting over seeds" in capsys.readouterr().out
    kept0 = arms["kept"][0]
    (kept0 / "history.json").write_text((arms["kept"][1] / "history.json").read_text())
    assert compare_runs.main(argv) == 2
    assert one_error_line(capsys).endswith(f"{kept0}/history.json: not the history of best.json's kept model "
                                           "(history.json's stage 2 differs in sst_acc)")
