"""scripts/ensemble.py, ensemble_scores.py and scores.py: votes and weighted means on hand-made scores, greedy selection
(against a brute-force reference), a one-member ensemble equal to its run, members that cannot be combined refused
in one line."""
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from ensemble import main

import multitask_classifier
from conftest import DEMO, prediction_flags, skip_figures
from evaluation import write_predictions
from minbert.data.batches import load_split
from minbert.data.scores import ScoresFileError, read_scores, scores_path, write_scores
from minbert.prediction.ensemble_scores import (METHODS, combine, greedy_selection, held_out_metric, load_members,
                                                member_predictions, member_weights, metric)
from minbert.tasks import MULTITASK, TASKS
from minbert.tasks.score_files import as_saved, file_sha256, train_record_path, write_train_record
from minbert.training.distillation import load_teacher

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")


# ---------------------------------------------------------------------------------------------------
# Combining hand-made scores


def sst_logits(classes: list[int], confidence: float = 2.0) -> np.ndarray:
    logits = np.zeros((len(classes), 5))
    logits[np.arange(len(classes)), classes] = confidence
    return logits


def test_sst_majority_vote_and_its_tie_break():
    members = [sst_logits([0, 1, 2]), sst_logits([0, 3, 4]), sst_logits([1, 3, 2], confidence=5.0)]
    # two votes for 0, two for 3, two for 2 (against one for 4)
    assert combine("sst", members, "vote").tolist() == [0, 3, 2]
    tied = [sst_logits([1]), sst_logits([4], confidence=3.0)]  # one vote each: the surer member's class wins
    assert combine("sst", tied, "vote").tolist() == [4]


def test_sst_mean_of_probabilities_can_overrule_the_vote():
    members = [sst_logits([0], 0.1), sst_logits([0], 0.1), sst_logits([3], 9.0)]
    assert combine("sst", members, "vote").tolist() == [0]
    assert combine("sst", members, "mean").tolist() == [3]


def test_qqp_votes_and_mean_probability():
    members = [np.array([2.0, -1.0, 0.5]), np.array([1.0, -2.0, -0.1]), np.array([-3.0, 1.0, -0.2])]
    assert combine("qqp", members, "vote").tolist() == [1, 0, 0]
    mean = np.mean([1 / (1 + np.exp(-m)) for m in members], axis=0) > 0.5
    assert combine("qqp", members, "mean").tolist() == mean.astype(int).tolist()
    assert TASKS["qqp"].outputs.probabilities(np.array([0.0])).tolist() == [[0.5, 0.5]]


def test_sts_mean_and_dev_weighted_mean():
    members = [np.array([1.0, 2.0]), np.array([3.0, 5.0])]
    assert combine("sts", members, "mean").tolist() == [2.0, 3.5]
    assert combine("sts", members, "weighted", [3.0, 1.0]).tolist() == [1.5, 2.75]
    with pytest.raises(ValueError, match="weight"):
        combine("sts", members, "weighted", [0.0, 0.0])
    with pytest.raises(ValueError, match="method"):
        combine("sts", members, "vote")


def test_greedy_selection_starts_from_the_best_member_and_keeps_only_what_helps():
    gold = np.array([1, 1, 0, 0, 1, 0])
    best = np.array([3.0, 3.0, -3.0, -3.0, -1.0, 1.0])  # 4 of 6 right
    wrong_on_4 = np.array([-1.0, 2.0, -1.0, 2.0, 2.0, -2.0])  # 4 of 6, right where `best` is wrong
    useless = np.array([-5.0, -5.0, 5.0, 5.0, -5.0, 5.0])  # always wrong
    chosen = greedy_selection("qqp", [best, wrong_on_4, useless], gold, "mean")
    assert chosen[0] == 0 and 2 not in chosen
    assert (combine("qqp", [[best, wrong_on_4, useless][i] for i in chosen], "mean") == gold).mean() > 4 / 6


def test_member_predictions_are_the_runs_own_decision_ties_included():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    assert member_predictions("sst", logits).tolist() == [1, 0] == logits.argmax(axis=-1).tolist()  # the lowest tied
    assert member_predictions("qqp", np.array([-0.5, 0.0, 0.5])).tolist() == [0, 0, 1]  # a logit of 0 is no paraphrase
    similarities = np.array([0.0, 4.5])
    assert np.array_equal(member_predictions("sts", similarities), similarities)


def numpy_decision(task, scores):
    """The decision rule as scripts/ensemble.py had it in numpy, before it used the runs' own (the task's decide)."""
    return scores.argmax(axis=-1) if task == "sst" else (scores > 0).astype(np.int64) if task == "qqp" else scores


def stacked_combine(task, members, method, weights=None):
    """combine as it was before its running sums: the members stacked and averaged afresh, numpy's own decision."""
    if task == "sts":
        stacked = np.stack(members)
        return stacked.mean(axis=0) if method == "mean" else np.average(stacked, axis=0, weights=weights)
    probabilities = np.mean([TASKS[task].outputs.probabilities(m) for m in members], axis=0)
    if method == "mean":
        return probabilities.argmax(axis=-1)
    votes = np.zeros_like(probabilities)
    for member in members:
        votes[np.arange(len(member)), numpy_decision(task, member)] += 1
    leading = votes == votes.max(axis=-1, keepdims=True)
    return np.where(leading, probabilities, -np.inf).argmax(axis=-1)


def brute_force_selection(task, members, gold, method):
    """greedy_selection as it was: every candidate's trial ensemble recombined from all of its members."""
    single = [metric(task, numpy_decision(task, m), gold) for m in members]
    chosen = [int(np.argmax(single))]
    best, best_size = single[chosen[0]], 1
    for _ in range(2 * len(members) - 1):
        trials = [metric(task, stacked_combine(task, [members[i] for i in chosen + [j]], method,
                                               member_weights(task, method, chosen + [j], single)), gold)
                  for j in range(len(members))]
        chosen.append(int(np.argmax(trials)))
        if max(trials) > best:
            best, best_size = max(trials), len(chosen)
    return chosen[:best_size]


def random_members(task, seed, examples=12):
    """Six members and the gold labels of a few examples, with ties everywhere: small integer logits (tied classes,
    QQP logits of 0), accuracies over 12 examples, and a member repeated, which ties with its copy in every round."""
    rng = np.random.default_rng(seed)
    if task == "sts":
        gold = rng.uniform(0, 5, examples)
        members = [gold * rng.uniform(-0.3, 1) + rng.normal(0, 1.5, examples) for _ in range(5)]
    else:
        classes = 5 if task == "sst" else 2
        gold = rng.integers(0, classes, examples)
        shape = (examples, 5) if task == "sst" else (examples,)
        members = [rng.integers(-1, 2, shape).astype(float) for _ in range(5)]
    return members[:3] + [members[1]] + members[3:], gold


@pytest.mark.parametrize("task,method", [(task, method) for task in MULTITASK
                                         for method in ("vote", "mean", "weighted") if method in METHODS[task]])
def test_greedy_selection_picks_what_the_brute_force_reference_picks(task, method):
    for seed in range(20):
        members, gold = random_members(task, seed)
        assert greedy_selection(task, members, gold, method) == brute_force_selection(task, members, gold, method)


@pytest.mark.parametrize("task,method", [(task, method) for task in MULTITASK
                                         for method in ("vote", "mean", "weighted") if method in METHODS[task]])
def test_combine_gives_the_bits_of_stacking_the_members(task, method):
    rng = np.random.default_rng(3)
    members = [rng.normal(size=(200, 5) if task == "sst" else 200) for _ in range(30)]
    weights = list(rng.uniform(0, 1, 30))
    for size in (1, 2, 9, 30):
        expected = stacked_combine(task, members[:size], method, weights[:size])
        assert np.array_equal(combine(task, members[:size], method, weights[:size]), expected)


def test_held_out_figure_exposes_what_selection_on_dev_overfits():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 200)
    noise = [rng.normal(size=200) for _ in range(30)]  # members that know nothing
    chosen = greedy_selection("qqp", noise, gold, "vote")
    selected = (combine("qqp", [noise[i] for i in chosen], "vote") == gold).mean()
    held_out = held_out_metric("qqp", noise, gold, "vote", repeats=2)
    assert selected > 0.6 and abs(held_out - 0.5) < 0.08  # chosen on dev, the noise looks like skill
    perfect = np.where(gold == 1, 2.0, -2.0)
    assert held_out_metric("qqp", [*noise, perfect], gold, "vote", repeats=1) == 1.0


def test_held_out_figure_averages_both_ways_of_several_random_halvings(monkeypatch):
    import minbert.prediction.ensemble_scores as ensemble_scores
    chosen_on = []

    def first_member(task, members, gold, method):
        chosen_on.append(len(gold))
        return [0]
    monkeypatch.setattr(ensemble_scores, "greedy_selection", first_member)
    rng = np.random.default_rng(1)
    held_out_metric("qqp", [rng.normal(size=11)], rng.integers(0, 2, 11), "vote", repeats=3)
    assert chosen_on == [5, 6] * 3  # each of three halvings chooses on one half, then on the other


# ---------------------------------------------------------------------------------------------------
# Scores files


def test_scores_round_trip_exactly_for_float32(tmp_path):
    values = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    write_scores(tmp_path / "s.csv", ["a", "b", "c", "d"], values, "sst")
    ids, read = read_scores(tmp_path / "s.csv", "sst")
    assert ids == ["a", "b", "c", "d"] and np.array_equal(read.astype(np.float32), values)
    write_scores(tmp_path / "q.csv", ["a"], np.array([0.25], dtype=np.float32), "qqp")
    assert read_scores(tmp_path / "q.csv", "qqp")[1].shape == (1,)


def test_a_score_on_a_rounding_boundary_is_decided_as_saved(tmp_path):
    # the float32 nearest to 1.291785: 6 digits of it give 1.29179, 6 digits of its 9-digit text read back 1.29178
    score = np.float32(1.291785)
    assert f"{float(score):.6g}" == "1.29179" and f"{float(f'{float(score):.9g}'):.6g}" == "1.29178"
    write_scores(tmp_path / "s.csv", ["a"], np.array([score]), "sts")
    assert np.array_equal(as_saved(np.array([score])), read_scores(tmp_path / "s.csv", "sts")[1])
    # a run's leaderboard files: the CSV says what its saved score decides, as a one-member ensemble would
    data = SimpleNamespace(test=["a test example"])
    predictor = SimpleNamespace(predict=lambda task, examples, scores: (["t"], np.array([score])))
    trainer = SimpleNamespace(tasks=("sts",), data={"sts": data}, distributed=SimpleNamespace(is_main=True),
                              predictor=predictor, evaluator=SimpleNamespace(chosen={}))
    paths = {("sts", split): tmp_path / f"sts-{split}-out.csv" for split in ("dev", "test")}
    multitask_classifier.write_leaderboard_files(trainer, paths, {"sts": (["d"], np.array([score]))}, tmp_path / "run")
    for split, row in (("dev", "d"), ("test", "t")):
        assert paths[("sts", split)].read_text().splitlines()[1] == f"{row},1.29178"
        assert read_scores(scores_path(tmp_path / "run", "sts", split), "sts")[1].tolist() == [1.291785]


@pytest.mark.parametrize("text,problem", [
    ("id,score\n", "no rows"), ("id,logit\na,1\n", "header"), ("id,score\na,1,2\n", "line 2: 3 fields"),
    ("id,score\na,x\n", "line 2: a score that is not a number"), ("id,score\na,nan\n", "not finite"),
    ("id,score\na,1\na,2\n", "repeated id"),
])
def test_bad_scores_files_are_named_with_their_problem(tmp_path, text, problem):
    (tmp_path / "s.csv").write_text(text)
    with pytest.raises(ScoresFileError, match=problem):
        read_scores(tmp_path / "s.csv", "sts")


@pytest.mark.parametrize("content,problem", [
    (b"id,score\n\xe9,1\n", "not UTF-8 text"), (b"id,score\n" + b"a" * 200_000 + b",1\n", "not a scores CSV"),
], ids=["latin-1", "a field over the csv module's limit"])
def test_scores_files_that_are_not_utf8_csv_are_named_with_their_problem(tmp_path, content, problem):
    (tmp_path / "s.csv").write_bytes(content)
    with pytest.raises(ScoresFileError, match=f"s.csv: {problem}"):
        read_scores(tmp_path / "s.csv", "sts")


# ---------------------------------------------------------------------------------------------------
# Whole runs


@pytest.fixture(scope="module")
def finished_run(tiny_checkpoint, tmp_path_factory):
    """A short multitask run on the demo data in float32: its output folder (with scores/) and its six CSVs."""
    out = tmp_path_factory.mktemp("member")
    flags = ["--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
             "--precision", "fp32",
             "--batch_size", "8", "--lr", "1e-3", "--max_length", "32", "--max_train_examples", "16",
             "--first_stages", "qqp,sts,sst", "--cycles", "0", "--output_dir", str(out / "run")]
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert multitask_classifier.main(flags + prediction_flags(out)) == 0
    return out


def test_a_run_saves_the_scores_its_predictions_were_decided_from(finished_run, tmp_path):
    for task in MULTITASK:
        for split in ("dev", "test"):
            ids, scores = read_scores(scores_path(finished_run / "run", task, split), task)
            flag = {"sst": "sst", "qqp": "para", "sts": "sts"}[task]
            write_predictions(tmp_path / "decided.csv", ids, member_predictions(task, scores).tolist(), task)
            assert (tmp_path / "decided.csv").read_text() == (finished_run / f"{flag}-{split}-out.csv").read_text()


def test_a_one_member_ensemble_writes_the_members_csvs(finished_run, tmp_path, capsys):
    assert main([str(finished_run / "run"), "--output_dir", str(tmp_path), "--data_dir", str(DEMO)]) == 0
    for flag in ("sst", "para", "sts"):
        for split in ("dev", "test"):
            name = f"{flag}-{split}-out.csv"
            assert (tmp_path / name).read_text() == (finished_run / name).read_text(), name
    report = json.loads((tmp_path / "ensemble.json").read_text())
    assert report["tasks"]["sts"]["ensemble_dev"] == report["tasks"]["sts"]["members_dev"][0]
    assert report["best_member"]["overall_dev"] == pytest.approx(report["dev"]["overall"])
    assert "ensemble on dev:" in capsys.readouterr().out


def other_member(finished_run, folder, sts_dev=None):
    """A second member: the finished run's scores, its STS dev scores shifted (or `sts_dev` from the ids)."""
    shutil.copytree(finished_run / "run" / "scores", folder / "scores")
    ids, scores = read_scores(scores_path(folder, "sts", "dev"), "sts")
    write_scores(scores_path(folder, "sts", "dev"), ids, np.clip(scores + 0.25, 0, 5) if sts_dev is None
                 else sts_dev(ids), "sts")
    return str(folder)


def test_selection_and_weights_run_end_to_end(finished_run, tmp_path, capsys):
    member = str(finished_run / "run")
    assert main([member, other_member(finished_run, tmp_path / "other"), "--output_dir", str(tmp_path / "e"),
                 "--data_dir", str(DEMO), "--select", "--sts", "weighted", "--sst", "mean"]) == 0
    out = capsys.readouterr().out
    assert "optimistic" in out and "held out (chosen on half of dev" in out
    report = json.loads((tmp_path / "e" / "ensemble.json").read_text())
    assert report["selected_on_dev"] is True and 0 < report["held_out_overall"] <= 1


def test_members_with_other_ids_or_missing_files_are_refused(finished_run, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(finished_run / "run" / "scores", other / "scores")
    path = scores_path(other, "sts", "test")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")  # one example fewer
    assert main([str(finished_run / "run"), str(other), "--output_dir", str(tmp_path / "e"),
                 "--data_dir", str(DEMO)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "sts-test.csv: its ids differ" in error
    scores_path(other, "qqp", "dev").unlink()
    assert main([str(other), "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO)]) == 2
    assert "qqp-dev.csv: no such scores file" in capsys.readouterr().err


def test_a_member_that_did_not_train_a_task_is_named_as_such_not_as_unfinished(finished_run, tmp_path, capsys):
    one_task = tmp_path / "sst_only"
    (one_task / "scores").mkdir(parents=True)
    for split in ("dev", "test"):
        shutil.copy(scores_path(finished_run / "run", "sst", split), scores_path(one_task, "sst", split))
    assert main([str(finished_run / "run"), str(one_task), "--output_dir", str(tmp_path / "e"),
                 "--data_dir", str(DEMO)]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"error: {one_task}: no qqp, sts scores: the run did not train qqp or sts (it has scores of sst); "
                     "an ensemble combines the tasks every member trained: give runs of the same tasks")


def test_an_output_dir_that_cannot_be_written_is_one_line(finished_run, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main([str(finished_run / "run"), "--output_dir", str(blocker), "--data_dir", str(DEMO)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {blocker}: cannot write there, {blocker} is a file, not a folder"


def test_the_same_run_twice_or_a_copy_of_it_is_refused(finished_run, tmp_path, capsys):
    member = finished_run / "run"
    for second in (str(member), str(member) + "/", str(member / ".." / "run")):
        assert main([str(member), second, "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO)]) == 2
        assert f"the same run as {member}; give each member once" in capsys.readouterr().err
    copy = tmp_path / "copy"
    shutil.copytree(member / "scores", copy / "scores")
    assert main([str(member), str(copy), "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO)]) == 2
    assert f"{copy}: its scores are {member}'s, all 6 files" in capsys.readouterr().err


def test_weighted_sts_with_no_member_above_zero_r_is_one_line(finished_run, tmp_path, capsys):
    gold = {e.id: e.label for e in load_split(DEMO, "sts", "dev")}
    against = [other_member(finished_run, tmp_path / name, lambda ids, k=k: np.array([5 - gold[i] * k for i in ids]))
               for name, k in (("a", 1.0), ("b", 0.5))]  # r = -1 each
    assert main([*against, "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO), "--sts", "weighted"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --sts weighted: every member's dev Pearson r is <= 0 (-1.0000, -1.0000)")
    assert err.endswith("use --sts mean") and "\n" not in err


def test_an_ensemble_refuses_to_write_into_a_member_and_leaves_no_stale_teacher(finished_run, tmp_path, capsys):
    member = str(finished_run / "run")
    assert main([member, "--output_dir", member, "--data_dir", str(DEMO)]) == 2
    assert "a member's own folder" in capsys.readouterr().err
    stale = scores_path(tmp_path / "e", "qqp", "train")  # an earlier ensemble's --score_train
    stale.parent.mkdir(parents=True)
    stale.write_text("id,logit\nx,0.5\n")
    assert main([member, "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO)]) == 0
    assert not stale.exists()


def test_an_ensemble_never_writes_into_a_runs_folder(finished_run, tmp_path, capsys):
    """A member's predictions/ (or any run's folder) holds that run's CSVs, which the ensemble's would replace."""
    member = finished_run / "run"
    for output_dir in (member / "predictions", member / "ensemble"):
        assert main([str(member), "--output_dir", str(output_dir), "--data_dir", str(DEMO)]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: --output_dir {output_dir}: inside the run folder {member.resolve()}, whose files "
                       "belong to that run; write elsewhere\n")
        assert not (output_dir / "ensemble.json").exists()


def calibrated_copy(finished_run, folder, temperatures: dict) -> str:
    """A member with the finished run's scores (train scores of QQP too) and a calibration.json of these
    temperatures."""
    shutil.copytree(finished_run / "run" / "scores", folder / "scores")
    ids, scores = read_scores(scores_path(folder, "qqp", "dev"), "qqp")
    write_scores(scores_path(folder, "qqp", "train"), ids, scores, "qqp")
    (folder / "calibration.json").write_text(json.dumps({"tasks": {task: {"temperature": t}
                                                                   for task, t in temperatures.items()}}))
    return str(folder)


def test_calibrated_members_average_probabilities_of_their_tempered_logits(finished_run, tmp_path):
    hot = calibrated_copy(finished_run, tmp_path / "hot", {"sst": 4.0, "qqp": 4.0})
    plain, calibrated = load_members([hot]), load_members([hot], calibrated=True)
    assert calibrated[0].temperatures == {"sst": 4.0, "qqp": 4.0}
    for key, (ids, scores) in plain[0].scores.items():
        divided = scores / 4.0 if TASKS[key[0]].calibrated else scores  # STS's scores are no logits
        assert calibrated[0].scores[key][0] == ids and np.array_equal(calibrated[0].scores[key][1], divided)
    # A member's own decisions do not move; a teacher's soft scores are of its calibrated probabilities.
    assert main([hot, "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO), "--calibrated",
                 "--score_train"]) == 0
    for name in ("sst-dev-out.csv", "para-test-out.csv"):
        assert (tmp_path / "e" / name).read_bytes() == (finished_run / name).read_bytes()
    report = json.loads((tmp_path / "e" / "ensemble.json").read_text())
    assert report["temperatures"] == {hot: {"sst": 4.0, "qqp": 4.0}}
    teacher = read_scores(scores_path(tmp_path / "e", "qqp", "train"), "qqp")[1]
    assert teacher == pytest.approx(plain[0].scores[("qqp", "dev")][1] / 4.0, abs=1e-6)


def test_calibrated_members_need_their_calibration_file(finished_run, tmp_path, capsys):
    member = calibrated_copy(finished_run, tmp_path / "m", {"sst": 2.0})
    assert main([member, "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO), "--calibrated"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path / 'm' / 'calibration.json'}: no qqp temperature; "
                                               f"rewrite it with scripts/calibrate.py {member} --data_dir DIR")
    (tmp_path / "m" / "calibration.json").unlink()
    assert main([member, "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO), "--calibrated"]) == 2
    assert "calibration.json: no such file" in capsys.readouterr().err


def test_an_ensemble_never_replaces_a_members_recorded_csvs(finished_run, tmp_path, capsys):
    """Audit: --output_dir R/B, the folder holding member B's recorded CSVs (not its run folder), replaced B's
    sst-dev-out.csv. A file a member's best.json records as its own is refused in one line, before any scores load."""
    other = other_member(finished_run, tmp_path / "other")
    before = {path: path.read_bytes() for path in finished_run.iterdir() if path.is_file()}
    assert main([other, str(finished_run / "run"), "--output_dir", str(finished_run), "--data_dir", str(DEMO)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --output_dir {finished_run}: its ") and "would replace the " \
        f"member {finished_run / 'run'}'s own" in err[0], err
    assert {path: path.read_bytes() for path in finished_run.iterdir() if path.is_file()} == before
    assert not (finished_run / "ensemble.json").exists()


def copied_run(finished_run, folder) -> Path:
    """The finished run's record, scores and calibration.json in another folder: a member as its own files hold it."""
    folder.mkdir()
    for name in ("best.json", "calibration.json"):
        shutil.copy(finished_run / "run" / name, folder / name)
    shutil.copytree(finished_run / "run" / "scores", folder / "scores")
    return folder


def test_a_members_dev_scores_copied_from_another_run_are_refused(finished_run, tmp_path, capsys):
    """Audit: a member whose scores/sst-dev.csv was another run's was combined as the member (its best.json was never
    opened). Decided as the run decided its CSVs, each member's dev scores must score the metric its best.json
    records; a copy is one line naming the file, exit 2, before anything is written."""
    member = copied_run(finished_run, tmp_path / "member")
    assert main([str(member), "--output_dir", str(tmp_path / "own"), "--data_dir", str(DEMO)]) == 0
    gold = {e.id: e.label for e in load_split(DEMO, "sst", "dev")}
    ids, _ = read_scores(scores_path(member, "sst", "dev"), "sst")
    write_scores(scores_path(member, "sst", "dev"), ids, sst_logits([gold[i] for i in ids]), "sst")  # all right
    recorded = json.loads((member / "best.json").read_text())["metrics"]["sst_acc"]
    assert recorded < 1
    capsys.readouterr()
    assert main([str(finished_run / "run"), str(member), "--output_dir", str(tmp_path / "e"),
                 "--data_dir", str(DEMO)]) == 2
    assert capsys.readouterr().err == (f"error: {scores_path(member, 'sst', 'dev')}: its sst_acc is 1.000000, not the "
                                       f"{recorded:.6f} that {member / 'best.json'} records: not this run's dev "
                                       "scores\n")
    assert not (tmp_path / "e").exists()


def test_a_calibrated_members_calibration_copied_from_another_run_is_refused(finished_run, tmp_path, capsys):
    """Audit: --calibrated divided a member's logits by the temperatures of a calibration.json copied from another
    run. The accuracies it records are those of the dev scores it was fitted on: they must be the member's."""
    member = copied_run(finished_run, tmp_path / "member")
    assert main([str(member), "--output_dir", str(tmp_path / "own"), "--data_dir", str(DEMO), "--calibrated"]) == 0
    calibration = json.loads((member / "calibration.json").read_text())
    calibration["tasks"]["qqp"]["accuracy"] += 0.125  # another run's, fitted on its own dev scores
    (member / "calibration.json").write_text(json.dumps(calibration))
    capsys.readouterr()
    assert main([str(member), "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO), "--calibrated"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {member / 'calibration.json'}: fitted on dev scores of qqp accuracy ")
    assert err.endswith(f"that {member / 'best.json'} records: not this run's calibration\n") and err.count("\n") == 1
    assert not (tmp_path / "e").exists()
    assert main([str(member), "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO)]) == 0  # not read


def recorded_teacher_member(finished_run, folder, shift: float = 0.0) -> Path:
    """A member written with --score_train: the finished run's record and scores, QQP train scores (its dev
    scores + shift) and scores/train.json tying them to its best.json."""
    member = copied_run(finished_run, folder)
    ids, scores = read_scores(scores_path(member, "qqp", "dev"), "qqp")
    write_scores(scores_path(member, "qqp", "train"), ids, scores + shift, "qqp")
    write_train_record(member, [scores_path(member, "qqp", "train")])
    return member


def test_an_ensemble_teacher_records_and_checks_the_train_scores_it_writes(finished_run, tmp_path):
    member = recorded_teacher_member(finished_run, tmp_path / "m")
    out = tmp_path / "e"
    assert main([str(member), "--output_dir", str(out), "--data_dir", str(DEMO), "--score_train"]) == 0
    record = json.loads(train_record_path(out).read_text())
    assert record == {"model": "ensemble.json", "model_sha256": file_sha256(out / "ensemble.json"),
                      "files": {"qqp-train.csv": file_sha256(scores_path(out, "qqp", "train"))}}
    ids = read_scores(scores_path(out, "qqp", "train"), "qqp")[0]
    assert set(load_teacher(out, {"qqp": ids})) == {"qqp"}  # an intact ensemble teacher teaches
    another_ensemble = json.loads((out / "ensemble.json").read_text()) | {"methods": {"qqp": "vote"}}
    (out / "ensemble.json").write_text(json.dumps(another_ensemble))  # another member set's in its place
    with pytest.raises(ScoresFileError, match=r"qqp-train.csv: written by another model than .*ensemble.json"):
        load_teacher(out, {"qqp": ids})
    assert main([str(member), "--output_dir", str(out), "--data_dir", str(DEMO)]) == 0
    assert not train_record_path(out).exists()  # no train scores, no record of them


def test_an_ensemble_refuses_a_members_train_scores_copied_from_another_run(finished_run, tmp_path, capsys):
    """Audit: a member's scores/qqp-train.csv that was another run's was combined into the teacher (exit 0). Refused
    in one line naming it, exit 2, before anything is written; a member without a record is read as before."""
    member = recorded_teacher_member(finished_run, tmp_path / "m")
    other = recorded_teacher_member(finished_run, tmp_path / "other", shift=0.5)
    shutil.copy(scores_path(other, "qqp", "train"), scores_path(member, "qqp", "train"))
    capsys.readouterr()
    assert main([str(member), "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO), "--score_train"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.startswith(f"error: {scores_path(member, 'qqp', 'train')}: not the train "
                                                  f"scores {train_record_path(member)} records"), error
    assert not (tmp_path / "e" / "ensemble.json").exists()
    train_record_path(member).unlink()  # written before the record existed: unchecked
    assert main([str(member), "--output_dir", str(tmp_path / "e"), "--data_dir", str(DEMO), "--score_train"]) == 0
