"""The robustness suite on an ensemble (minbert/robustness/ensemble_predictor.py, scripts/robustness.py with several
runs): an ensemble of one run scores exactly as the run; an ensemble of two scores the mean of its members'
probabilities (STS: scores), computed here directly; the embedding attack raises the members' mean loss as eps grows;
a greedy query is one evaluation of every member, within the budget; members that cannot share one text's tokens
are refused in one line."""
import json
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import MAX_LENGTH, deterministic_tiny_model, demo_examples
from minbert.data.batches import TokenizedSplits
from minbert.prediction.ensemble_scores import teacher_scores
from minbert.prediction.inference import PredictionSettings, Predictor
from minbert.robustness import ensemble_predictor
from minbert.robustness.embedding_attack import EmbeddingAttack, attack_examples
from minbert.robustness.ensemble_predictor import EnsemblePredictor, RunPredictor
from minbert.robustness.greedy_attack import GreedyAttack
from minbert.robustness.neighbours import EmbeddingNeighbours
from minbert.robustness.perturbed_sets import SetOptions, make_sets, read_sets
from minbert.robustness.suite import embedding_rows, greedy_rows, noise_rows
from minbert.robustness.text_noise import Noise
from minbert.tasks import MULTITASK, TASKS, task_settings
from test_robustness import SCRIPT_FLAGS, checkpoint_must_not_load, tiny_run  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

# Each task's member scores -> class probabilities (SST: softmax of 5 logits, QQP: sigmoid of one), or STS's scores.
PROBABILITIES = {"sst": lambda s: torch.softmax(s, dim=-1), "qqp": torch.sigmoid, "sts": lambda s: s}
DECIDED = {"sst": lambda p: p.argmax(-1), "qqp": lambda p: (p > 0.5).long(), "sts": lambda p: p}


def predictor_of(model, tokenizer) -> Predictor:
    splits = TokenizedSplits(tokenizer, model, MAX_LENGTH, task_settings({}))
    return Predictor(model, splits, torch.device("cpu"), PredictionSettings(8, MAX_LENGTH, "fp32", True))


def members(tokenizer, seeds=(1, 2)) -> list[Predictor]:
    return [predictor_of(deterministic_tiny_model(seed), tokenizer) for seed in seeds]


def neighbours_of(predictor: Predictor) -> EmbeddingNeighbours:
    return EmbeddingNeighbours(predictor.splits.tokenizer.backend.get_vocab(),
                               predictor.model.bert.embeddings.word_embeddings.weight, 4)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sets")
    noises = [Noise("char_swap", 0.3), Noise("word_delete", 0.3)]
    make_sets(folder, {task: demo_examples(task, "dev") for task in MULTITASK}, noises, SetOptions(0, 24), None, {})
    return read_sets(folder, list(MULTITASK))


@pytest.mark.parametrize("task", MULTITASK)
def test_an_ensemble_of_one_run_scores_exactly_as_the_run(tokenizer, sets, task):
    """Through the mean of one member's probabilities (its scores recomputed from them), every family's rows and
    every greedy outcome are the run's own."""
    (predictor,) = members(tokenizer, (1,))
    run, ensemble = RunPredictor(predictor), EnsemblePredictor([predictor])
    for family in ("char", "word"):
        assert noise_rows(ensemble, sets, task, family, 100, 0) == noise_rows(run, sets, task, family, 100, 0)
    attacked, attack = sets.clean[task][:6], EmbeddingAttack((0.01, 0.5), steps=2)
    assert (embedding_rows(ensemble, task, attacked, attack, 100, 0)
            == embedding_rows(run, task, attacked, attack, 100, 0))
    greedy = GreedyAttack(8, 0.2)
    rows, outcomes = greedy_rows(ensemble, task, attacked, neighbours_of(predictor), greedy, 100, 0)
    expected_rows, expected = greedy_rows(run, task, attacked, neighbours_of(predictor), greedy, 100, 0)
    assert rows == expected_rows
    assert ([(o.example, o.queries, o.success) for o in outcomes]
            == [(o.example, o.queries, o.success) for o in expected])


@pytest.mark.parametrize("task", MULTITASK)
def test_an_ensemble_of_two_scores_the_mean_of_its_members_probabilities(tokenizer, sets, task):
    predictors = members(tokenizer)
    ensemble = EnsemblePredictor(predictors)
    variant = sets.variants["char_swap-0.3"][task]
    ids, scores = ensemble.predict(task, variant, scores=True)
    each = [PROBABILITIES[task](torch.from_numpy(p.predict(task, variant, scores=True)[1]).double())
            for p in predictors]
    mean = ((each[0] + each[1]) / 2).numpy()
    assert ids == [example.id for example in variant]
    assert not np.allclose(mean, each[0].numpy(), atol=1e-6)  # the members differ: the mean is neither of them
    assert np.allclose(PROBABILITIES[task](torch.from_numpy(scores)).numpy(), mean, rtol=1e-5, atol=1e-7)
    decided = DECIDED[task](torch.from_numpy(mean)).numpy()
    assert np.allclose(ensemble.predict(task, variant)[1], decided, rtol=1e-6)  # classes: equal
    gold = np.array([example.label for example in variant])
    row = next(row for row in noise_rows(ensemble, sets, task, "char", 100, 0) if row.variant == "char_swap-0.3")
    assert row.perturbed.value == pytest.approx(TASKS[task].model.metrics(decided, gold)[TASKS[task].model.score_key])


@pytest.mark.parametrize("task", MULTITASK)
def test_the_embedding_attack_on_an_ensemble_raises_the_members_mean_loss_monotonically(tokenizer, task):
    predictors = members(tokenizer)
    examples = demo_examples(task, "dev", 16)
    result = EnsemblePredictor(predictors).attack_embeddings(task, examples, EmbeddingAttack((1e-3, 1e-2, 0.1, 0.5), 3))
    assert all(later >= earlier for earlier, later in zip(result.losses, result.losses[1:])), result.losses
    assert result.losses[-1] > result.losses[0] * 1.01
    alone = [attack_examples([p.model], task, examples, tokenizer, torch.device("cpu"), 8, MAX_LENGTH,
                             EmbeddingAttack((1e-3,), 1)) for p in predictors]
    assert result.losses[0] == pytest.approx(np.mean([a.losses[0] for a in alone]), rel=1e-6)  # clean: their mean
    assert np.allclose(result.clean_scores, teacher_scores(task, [a.clean_scores for a in alone]), atol=1e-6)
    assert result.ids == [e.id for e in examples] and len(result.scores[0.5]) == len(examples)


def test_the_greedy_attack_on_an_ensemble_counts_ensemble_queries_within_its_budget(tokenizer, monkeypatch):
    """Each query the budget counts is one evaluation of every member: each member is asked each input once."""
    predictors = members(tokenizer)
    asked, fresh_scores = Counter(), ensemble_predictor.fresh_scores

    def counted(predictor, task, examples):
        asked[id(predictor)] += len(examples)
        return fresh_scores(predictor, task, examples)
    monkeypatch.setattr(ensemble_predictor, "fresh_scores", counted)
    for task in ("sst", "sts"):
        for budget in (1, 5, 12):
            asked.clear()
            rows, outcomes = greedy_rows(EnsemblePredictor(predictors), task, demo_examples(task, "dev", 4),
                                         neighbours_of(predictors[0]), GreedyAttack(budget, 0.2), 100, 0)
            assert all(outcome.queries <= budget for outcome in outcomes)
            assert rows[0].details["most queries"] <= budget
            assert asked[id(predictors[0])] == asked[id(predictors[1])] == sum(o.queries for o in outcomes)


# ---------------------------------------------------------------------------------------------------
# scripts/robustness.py with several runs


def test_several_runs_are_scored_as_one_ensemble_on_the_same_sets(tmp_path, tiny_checkpoint):
    import robustness
    first, second = tiny_run(tmp_path / "a", tiny_checkpoint, 1), tiny_run(tmp_path / "b", tiny_checkpoint, 2)
    assert robustness.main([str(first), *SCRIPT_FLAGS]) == 0
    sets = first / "robustness" / "perturbed"
    out = tmp_path / "ensemble"
    assert robustness.main([str(first), str(second), "--output_dir", str(out), "--perturbed_dir", str(sets),
                            *SCRIPT_FLAGS]) == 0
    report = json.loads((out / "robustness.json").read_text())
    assert report["settings"]["members"] == [str(first), str(second)] and report["settings"]["ensemble"] == "mean"
    assert report["settings"]["checkpoints"] == [str(first / "best"), str(second / "best")]
    assert report["settings"]["checkpoints_sha256"] == [json.loads((run / "best.json").read_text())["sha256"]
                                                        for run in (first, second)]
    assert Counter(row["family"] for row in report["rows"]) == {"char": 12, "word": 9, "embedding": 6, "greedy": 3}
    assert all(row["details"]["most queries"] <= 6 for row in report["rows"] if row["family"] == "greedy")
    assert (out / "robustness.md").read_text().startswith(f"# Robustness of an ensemble of 2 runs: {first}, {second}")
    assert not (out / "perturbed").exists()  # the first run's sets, read


def test_several_runs_need_an_output_dir(tmp_path, capsys):
    import robustness
    with pytest.raises(SystemExit) as stopped:
        robustness.main([str(tmp_path / "a"), str(tmp_path / "b")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(lines) == 1 and "--output_dir" in lines[0], lines


def other_vocabulary(tiny_checkpoint, folder):
    """tiny_checkpoint's pretrained folder with one word of its tokenizer's vocabulary renamed."""
    import shutil
    shutil.copytree(tiny_checkpoint, folder)
    settings = json.loads((folder / "tokenizer.json").read_text())
    settings["model"]["vocab"]["filmmaking"] = settings["model"]["vocab"].pop("film")
    (folder / "tokenizer.json").write_text(json.dumps(settings))
    return folder


def test_members_that_cannot_share_a_text_are_refused_in_one_line_before_they_load(tmp_path, tiny_checkpoint, capsys,
                                                                                  checkpoint_must_not_load):
    import robustness
    run = tiny_run(tmp_path / "run", tiny_checkpoint, 1)
    shorter = tiny_run(tmp_path / "shorter", tiny_checkpoint, 2, max_length=16)
    sst_only = tiny_run(tmp_path / "sst_only", tiny_checkpoint, 3, tasks=("sst",))
    other = tiny_run(tmp_path / "other", other_vocabulary(tiny_checkpoint, tmp_path / "vocabulary"), 4)
    cases = [([run, shorter], f"{shorter}: its max_length 16 (the first run's: {MAX_LENGTH})"),
             ([run, sst_only], f"{sst_only / 'best'}: the model has no qqp, sts head (it has sst)"),
             ([run, sst_only, "--tasks", "sts"], f"{sst_only / 'best'}: the model has no sts head"),
             ([run, other], f"{other}: its tokenizer's vocabulary is not the first run's"),
             ([run, tmp_path / "run" / "best"], f"{tmp_path / 'run' / 'best'}: the same kept model as {run}")]
    for argv, problem in cases:
        assert robustness.main([*map(str, argv), "--output_dir", str(tmp_path / "out"), "--quiet"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and problem in lines[0], lines
    with pytest.raises(AssertionError, match="loaded before"):  # the task both have: checked, then loading begins
        robustness.main([str(run), str(sst_only), "--tasks", "sst", "--output_dir", str(tmp_path / "out"), "--quiet"])


def test_members_reading_pairs_differently_are_refused_for_the_embedding_attack(tmp_path, tiny_checkpoint, capsys):
    import robustness
    run, cross = tiny_run(tmp_path / "run", tiny_checkpoint, 1), tiny_run(tmp_path / "cross", tiny_checkpoint, 2,
                                                                           pair_encoder="cross")
    argv = [str(run), str(cross), "--output_dir", str(tmp_path / "out"), "--tasks", "sst,qqp", "--quiet"]
    assert robustness.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{cross}: reads qqp's pairs as one sequence" in lines[0], lines
