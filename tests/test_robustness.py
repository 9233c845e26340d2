"""The robustness suite (minbert/robustness/, scripts/robustness.py): every noise is seeded, reproducible and changes
what it claims at the rate asked, on fixed sentences; the perturbed sets read back as written; the embedding attack's
loss never falls as eps grows and rises above the clean loss; the greedy attack never passes its budget; the script
reuses a folder of sets for a second run and refuses bad input in one line before the model loads."""
import json
import math
import random
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import DEMO, MAX_LENGTH, deterministic_tiny_model, demo_examples
from minbert.files import DataError
from minbert.prediction.new_inputs import read_examples
from minbert.robustness.embedding_attack import EmbeddingAttack, attack_examples
from minbert.robustness.greedy_attack import GreedyAttack, attack_example, harm
from minbert.robustness.neighbours import EmbeddingNeighbours
from minbert.robustness.perturbed_sets import SetOptions, make_sets, read_sets
from minbert.robustness.text_noise import (CHAR_KINDS, KEYBOARD, KINDS, LETTERS, Noise, Words,
                                           neighbour_forms, perturb_examples, stochastic_count)
from minbert.tasks import MULTITASK, TASKS, course_file_name
from minbert.tasks.course_files import PairExample, SentenceExample, write_examples

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = [
    "It 's a lovely film with lovely performances by Buy and Accorsi .",
    "No one goes unindicted here , which is probably for the best .",
    "How do I learn Python quickly?",
    "Two black dogs are playing on the grass.",
    "A GRIPPING, funny film -- and (mostly) well acted!",
    "UN chief welcomes peaceful presidential elections in Guinea",
]
NEIGHBOURS = {"film": ["movie", "picture"], "lovely": ["beautiful"], "dogs": ["cats", "puppies"], "black": ["white"],
              "funny": ["hilarious", "comic"], "grass": ["lawn"], "learn": ["study"], "chief": ["head", "boss"]}


def fake_neighbours(word):
    return NEIGHBOURS.get(word, [])


def one_edit(kind, before, after):
    """Whether `after` is `before` with exactly one edit of the character noise `kind`."""
    if kind == "char_insert":
        return len(after) == len(before) + 1 and any(after[:i] + after[i + 1:] == before for i in range(len(after)))
    if kind == "char_delete":
        return len(after) == len(before) - 1 and any(before[:i] + before[i + 1:] == after for i in range(len(before)))
    places = [i for i in range(len(before)) if before[i] != after[i]] if len(after) == len(before) else []
    if kind == "char_swap":
        return len(places) == 2 and places[1] == places[0] + 1 and after[places[0]] == before[places[1]] \
            and after[places[1]] == before[places[0]]
    return len(places) == 1 and after[places[0]].lower() in KEYBOARD[before[places[0]].lower()]


@pytest.mark.parametrize("kind", CHAR_KINDS)
@pytest.mark.parametrize("rate", [0.1, 0.3, 1.0])
def test_character_noise_makes_one_edit_of_its_kind_in_the_share_of_words_asked(kind, rate):
    for number, sentence in enumerate(SENTENCES):
        text, changed, eligible = Noise(kind, rate).apply(sentence, random.Random(number))
        assert (text, changed, eligible) == Noise(kind, rate).apply(sentence, random.Random(number))  # seeded
        assert changed in {math.floor(rate * eligible), math.ceil(rate * eligible)}
        before, after = LETTERS.findall(sentence), LETTERS.findall(text)
        assert LETTERS.sub("", sentence) == LETTERS.sub("", text)  # nothing but the words' letters changes
        assert len(before) == len(after)
        edited = [(b, a) for b, a in zip(before, after) if b != a]
        assert len(edited) == changed and all(one_edit(kind, b, a) for b, a in edited)


@pytest.mark.parametrize("kind", KINDS)
def test_over_many_texts_the_share_of_words_changed_is_the_rate(kind):
    rate, changed, eligible = 0.15, 0, 0
    for number in range(300):
        _, done, could = Noise(kind, rate).apply(SENTENCES[number % len(SENTENCES)], random.Random(number),
                                                 fake_neighbours)
        changed, eligible = changed + done, eligible + could
    assert eligible > 300 and abs(changed / eligible - rate) < 0.03


def test_stochastic_counts_round_to_the_rate_on_average():
    rng = random.Random(0)
    counts = [stochastic_count(0.25, 3, rng) for _ in range(4000)]
    assert set(counts) == {0, 1} and abs(np.mean(counts) - 0.75) < 0.03


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_word_deletion_removes_the_share_asked_and_nothing_else(rate):
    for number, sentence in enumerate(SENTENCES):
        text, changed, eligible = Noise("word_delete", rate).apply(sentence, random.Random(number))
        words, kept = Words.of(sentence), Words.of(text)
        assert changed in {math.floor(rate * eligible), math.ceil(rate * eligible)}
        assert eligible == len(words.words()) and len(kept.words()) == eligible - changed
        remaining = iter(words.parts[0::2])
        assert all(token in remaining for token in kept.parts[0::2])  # the rest, in order
        assert text == text.strip() and "  " not in text


@pytest.mark.parametrize("rate", [0.4, 1.0])
def test_word_swaps_move_the_share_asked_by_trading_adjacent_words(rate):
    for number, sentence in enumerate(SENTENCES):
        text, changed, eligible = Noise("word_swap", rate).apply(sentence, random.Random(number))
        before, after = Words.of(sentence), Words.of(text)
        assert Counter(after.parts) == Counter(before.parts) and after.parts[1::2] == before.parts[1::2]
        moved = [place for place in before.words() if before.parts[place] != after.parts[place]]
        assert len(moved) == changed <= math.ceil(rate * eligible / 2) * 2 and changed % 2 == 0
        places = before.words()
        for first in moved[::2]:
            second = places[places.index(first) + 1]
            assert (after.parts[first], after.parts[second]) == (before.parts[second], before.parts[first])
    short = "a quick brown fox jumps over the lazy dog"  # differing neighbours everywhere: every swap is found
    for number in range(20):
        _, changed, eligible = Noise("word_swap", 0.5).apply(short, random.Random(number))
        assert changed in {4, 6} and eligible == 9  # 0.5 x 9 / 2 = 2.25 swaps: 2 or 3


def test_neighbour_replacement_keeps_case_and_punctuation():
    assert neighbour_forms("(Film),", fake_neighbours) == ["(Movie),", "(Picture),"]
    assert neighbour_forms("FUNNY", fake_neighbours) == ["HILARIOUS", "COMIC"]
    assert neighbour_forms("it's", fake_neighbours) == [] and neighbour_forms("grass.", fake_neighbours) == ["lawn."]
    text, changed, eligible = Noise("word_neighbour", 1.0).apply(SENTENCES[3], random.Random(0), fake_neighbours)
    assert (changed, eligible) == (3, 3)
    assert text in {"Two white cats are playing on the lawn.", "Two white puppies are playing on the lawn."}


def test_the_keyboard_is_a_symmetric_neighbourhood():
    assert set(KEYBOARD["a"]) == set("qwsz") and set(KEYBOARD["g"]) == set("fhtybv")
    assert all(key in KEYBOARD[other] for key, around in KEYBOARD.items() for other in around)


def test_embedding_neighbours_are_the_nearest_whole_words_by_cosine():
    vocabulary = {"[CLS]": 0, "good": 1, "great": 2, "bad": 3, "##ly": 4, "fine": 5}
    embeddings = torch.tensor([[1.0, 1.0], [1.0, 0.1], [1.0, 0.0], [-1.0, 0.0], [1.0, 0.1], [0.7, 0.7]])
    neighbours = EmbeddingNeighbours(vocabulary, embeddings, k=2)
    assert neighbours("good") == ["great", "fine"]  # not ##ly, its twin, nor [CLS]
    assert neighbours("ly") == [] and neighbours("[CLS]") == []


def test_perturbing_examples_is_seeded_per_example_and_perturbs_both_sentences_of_a_pair():
    pairs = demo_examples("sts", "dev", 12)
    noise = Noise("char_keyboard", 0.5)
    first, changed, _ = perturb_examples(pairs, ("sentence1", "sentence2"), noise, seed=0)
    assert perturb_examples(pairs, ("sentence1", "sentence2"), noise, seed=0)[0] == first
    assert perturb_examples(pairs[5:], ("sentence1", "sentence2"), noise, seed=0)[0] == first[5:]  # per example
    assert perturb_examples(pairs, ("sentence1", "sentence2"), noise, seed=1)[0] != first
    assert sum(a.sentence1 != b.sentence1 for a, b in zip(first, pairs)) > 6
    assert sum(a.sentence2 != b.sentence2 for a, b in zip(first, pairs)) > 6
    assert [(e.id, e.label) for e in first] == [(e.id, e.label) for e in pairs] and changed > 12


def test_course_files_written_read_back_as_they_were(tmp_path):
    quoted = [PairExample("q1", 'Is "the" here?', '"Quoted" at the start', 1.0)]
    for task, examples in (("sst", demo_examples("sst", "dev")), ("qqp", demo_examples("qqp", "dev") + quoted)):
        path = tmp_path / course_file_name(task, "dev")
        write_examples(path, examples, TASKS[task].text_columns, TASKS[task].label_column)
        assert TASKS[task].data.load(path, "dev") == examples
        # As predict.py reads it: the texts, without the labels it does not need.
        assert read_examples(TASKS[task], str(path), "course") == [replace(e, label=None) for e in examples]
    with pytest.raises(ValueError, match="line break"):
        write_examples(tmp_path / "x.csv", [PairExample("q", "a\nb", "c", 0.0)], ("sentence1", "sentence2"),
                       "is_duplicate")


def test_sets_are_made_reproducibly_and_read_back_checked(tmp_path):
    dev = {task: demo_examples(task, "dev") for task in MULTITASK}
    noises = [Noise(kind, rate) for kind in ("char_swap", "word_delete", "word_neighbour") for rate in (0.1, 0.3)]
    made = {}
    for name in ("a", "b"):
        manifest = make_sets(tmp_path / name, dev, noises, SetOptions(seed=3, max_examples=25), fake_neighbours,
                             {"run": "test"})
        made[name] = {p.relative_to(tmp_path / name): p.read_bytes() for p in (tmp_path / name).rglob("*.csv")}
    assert made["a"] == made["b"] and len(made["a"]) == 3 * (1 + len(noises))
    assert manifest["tasks"]["sst"] == {"file": "ids-sst-dev.csv", "examples": 25, "of": 40}
    sets = read_sets(tmp_path / "a", ["sst", "sts"])
    assert [e.id for e in sets.clean["sst"]] == [e.id for e in dev["sst"] if e.id in {c.id for c in sets.clean["sst"]}]
    share = manifest["variants"]["word_delete-0.3"]["words_changed"]["sts"]["share"]
    assert abs(share - 0.3) < 0.05
    assert sum(a != b for a, b in zip(sets.variants["char_swap-0.3"]["sts"], sets.clean["sts"])) > 10
    broken = tmp_path / "a" / "word_delete-0.1" / "sts-dev.csv"
    broken.write_text(broken.read_text().replace(sets.clean["sts"][0].id, "other-id"))
    with pytest.raises(DataError, match="ids or labels differ"):
        read_sets(tmp_path / "a", ["sts"])
    make_sets(tmp_path / "c", {"sst": dev["sst"]}, noises[:1], SetOptions(0, None), None, {})
    with pytest.raises(DataError, match="holds no qqp"):
        read_sets(tmp_path / "c", ["qqp"])


@pytest.mark.parametrize("task", MULTITASK)
def test_the_embedding_attack_raises_the_loss_monotonically_in_eps(tokenizer, task):
    model = deterministic_tiny_model(seed=1)
    examples = demo_examples(task, "dev", 24)
    attack = EmbeddingAttack(epsilons=(1e-3, 1e-2, 1e-1, 0.5), steps=3)
    result = attack_examples([model], task, examples, tokenizer, torch.device("cpu"), 8, MAX_LENGTH, attack)
    assert all(later >= earlier for earlier, later in zip(result.losses, result.losses[1:])), result.losses
    assert result.losses[-1] > result.losses[0] * 1.01
    assert result.ids == [e.id for e in examples] and len(result.scores[0.5]) == len(examples)
    again = attack_examples([model], task, examples, tokenizer, torch.device("cpu"), 8, MAX_LENGTH, attack)
    assert again.losses == result.losses  # nothing random


def test_the_embedding_attack_refuses_a_sweep_it_cannot_run():
    for bad in [(), (0.0,), (0.1, 0.01), (float("nan"),)]:
        with pytest.raises(ValueError):
            EmbeddingAttack(bad)


class CountingQuery:
    """A fake classifier of SST: the logits rise for class 3 with each 'lovely' and fall with each 'dull'."""

    def __init__(self):
        self.asked = 0

    def __call__(self, examples):
        self.asked += len(examples)
        scores = np.zeros((len(examples), 5))
        for row, example in enumerate(examples):
            words = example.sentence.lower().split()
            scores[row, 3] = 1 + words.count("lovely") - 3 * words.count("dull")
            scores[row, 1] = 1.5 * words.count("dull")
        return scores


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 40])
def test_the_greedy_attack_never_exceeds_its_budget(budget):
    example = SentenceExample("x", "A lovely film , lovely and funny .", 3)
    neighbours = {"lovely": ["dull", "nice"], "film": ["movie", "picture", "show"], "funny": ["dull"]}.get
    query = CountingQuery()
    outcome = attack_example(example, TASKS["sst"], query, lambda w: neighbours(w, []), GreedyAttack(budget))
    assert query.asked == outcome.queries <= budget
    if budget >= 40:  # ranks 4 words (4 queries), then swaps in 'dull' until class 3 is lost
        assert outcome.success and outcome.words_changed == 1 and "dull" in outcome.example.sentence.lower()


def test_the_greedy_attack_on_a_tiny_model_stays_in_budget_and_reports_its_outcomes(tokenizer):
    model = deterministic_tiny_model(seed=2)
    vocabulary = tokenizer.backend.get_vocab()
    neighbours = EmbeddingNeighbours(vocabulary, model.bert.embeddings.word_embeddings.weight, k=4)
    from minbert.prediction.inference import predict_examples
    for task in ("sst", "sts"):
        asked = []

        def query(examples):
            asked.append(len(examples))
            return predict_examples(model, task, examples, tokenizer, torch.device("cpu"), 16, MAX_LENGTH,
                                    scores=True)[1]
        for example in demo_examples(task, "dev", 4):
            asked.clear()
            outcome = attack_example(example, TASKS[task], query, neighbours, GreedyAttack(12, 0.2))
            assert sum(asked) == outcome.queries <= 12
            assert outcome.example.id == example.id and outcome.words_changed <= outcome.queries
            if outcome.success and task == "sts":
                assert harm(TASKS[task], outcome.scores[None], example.label)[0] >= 0.2


# ---------------------------------------------------------------------------------------------------
# scripts/robustness.py

SET_FLAGS = ["--max_examples", "20", "--rates", "0.2", "--replicates", "100", "--quiet"]  # what every family takes
SCRIPT_FLAGS = [*SET_FLAGS, "--attack_examples", "4", "--epsilons", "0.01", "0.5", "--attack_steps", "2", "--budget",
                "6", "--neighbours", "3"]


def tiny_run(folder, tiny_checkpoint, seed, max_length=MAX_LENGTH, **heads):
    """A run's folder keeping a tiny model (random heads; `heads`: MultitaskBERT's options) as a run keeps it:
    best.json with the run's args."""
    from minbert.model.multitask_bert import save_multitask_model
    folder.mkdir(parents=True)
    args = {"pretrained": str(tiny_checkpoint), "max_length": max_length, "eval_batch_size": 8, "precision": "fp32",
            "data_dir": str(DEMO)}
    save_multitask_model(deterministic_tiny_model(seed, **heads), folder / "best", {"args": args})
    return folder


@pytest.fixture
def checkpoint_must_not_load(monkeypatch):
    from minbert.run import kept_ensemble

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was validated")
    monkeypatch.setattr(kept_ensemble, "load_multitask_checkpoint", refuse)


def test_a_second_run_is_scored_on_the_first_runs_sets_which_predict_reads_too(tmp_path, tiny_checkpoint, capsys):
    import predict
    import robustness
    first, second = tiny_run(tmp_path / "a", tiny_checkpoint, 1), tiny_run(tmp_path / "b", tiny_checkpoint, 2)
    assert robustness.main([str(first), *SCRIPT_FLAGS]) == 0  # --data_dir: the run's own
    sets = first / "robustness" / "perturbed"
    written = {path: path.read_bytes() for path in sets.rglob("*.csv")}
    assert len(written) == 3 * (1 + 7)  # clean and the seven kinds at one rate, per task
    assert robustness.main([str(second), "--perturbed_dir", str(sets), "--rates", "0.5", *SCRIPT_FLAGS]) == 0
    assert {path: path.read_bytes() for path in sets.rglob("*.csv")} == written  # read, not made again
    reports = [json.loads((run / "robustness" / "robustness.json").read_text()) for run in (first, second)]
    for report in reports:
        rows = report["rows"]
        assert Counter(row["family"] for row in rows) == {"char": 12, "word": 9, "embedding": 6, "greedy": 3}
        assert {row["variant"] for row in rows if row["family"] == "word"} == {
            "word_delete-0.2", "word_swap-0.2", "word_neighbour-0.2"}  # the first run's rates
        for row in rows:
            assert row["examples"] == (20 if row["family"] in ("char", "word") else 4)
            assert row["drop"]["low"] <= row["drop"]["value"] <= row["drop"]["high"]
            assert row["drop"]["value"] == pytest.approx(row["clean"]["value"] - row["perturbed"]["value"])
            if row["family"] == "greedy":
                assert row["details"]["most queries"] <= 6
        losses = [(row["details"]["clean loss"], row["details"]["loss"]) for row in rows
                  if row["family"] == "embedding" and row["task"] == "sst"]
        assert losses[0][0] <= losses[0][1] <= losses[1][1]
    assert reports[1]["settings"]["perturbed_dir"] == str(sets)
    assert "| SST acc | char | char_swap-0.2 | 20 |" in (second / "robustness" / "robustness.md").read_text()
    for task in ("sst", "qqp"):
        records = (first / "robustness" / f"greedy-{task}.jsonl").read_text().splitlines()
        assert len(records) == 4 and all(json.loads(r)["queries"] <= 6 for r in records)
    capsys.readouterr()
    variant = sets / "char_keyboard-0.2" / "quora-dev.csv"
    assert predict.main([str(first), "--task", "qqp", "--input", str(variant), "--output",
                         str(tmp_path / "qqp.csv"), "--quiet"]) == 0
    assert len((tmp_path / "qqp.csv").read_text().splitlines()) == 21


def toy_rows(run):
    """A toy family: the first examples' predictions against themselves (a drop of 0), and their ids kept."""
    from minbert.robustness.report import score_rows
    from minbert.robustness.suite import predictions_of
    predicted = predictions_of(run.task, run.predictor.predict(run.task, run.attacked, scores=True)[1])
    rows = score_rows(run.task, "toy", run.attacked, predicted, {"identity": predicted},
                      {"identity": {"toy detail": 1}},
                      run.settings.replicates, run.settings.seed)
    return rows, [example.id for example in run.attacked]


def write_toy(output_dir, task, ids):
    (output_dir / f"toy-{task}.txt").write_text("\n".join(map(str, ids)))


@pytest.fixture
def toy_family():
    from minbert.robustness.suite import FAMILIES, Family, register_family
    yield register_family(Family("toy", toy_rows, write_outcomes=write_toy, flags=("attack_examples",)))
    del FAMILIES["toy"]


def test_a_registered_family_is_run_by_the_suite_and_the_script(tmp_path, tiny_checkpoint, toy_family, capsys):
    import robustness
    from minbert.robustness.suite import FAMILIES
    assert list(FAMILIES) == ["char", "word", "embedding", "greedy", "toy"]  # --families' choices, in this order
    run = tiny_run(tmp_path / "a", tiny_checkpoint, 1)
    assert robustness.main([str(run), "--families", "toy", *SET_FLAGS, "--attack_examples", "4"]) == 0
    report = json.loads((run / "robustness" / "robustness.json").read_text())
    assert [(row["task"], row["family"], row["variant"], row["examples"], row["drop"]["value"], row["details"])
            for row in report["rows"]] == [(task, "toy", "identity", 4, 0.0, {"toy detail": 1}) for task in MULTITASK]
    assert set(report["seconds"]) == {"toy", "making the sets"} and set(report["seconds"]["toy"]) == set(MULTITASK)
    for task in MULTITASK:
        assert len(set((run / "robustness" / f"toy-{task}.txt").read_text().splitlines())) == 4  # the attacked
    assert not list((run / "robustness").glob("greedy-*.jsonl"))


def test_a_family_name_is_registered_once(toy_family):
    from minbert.robustness.suite import Family, register_family
    with pytest.raises(ValueError, match="'toy' is registered already"):
        register_family(Family("toy", toy_rows))


@pytest.mark.parametrize("flags, problem", [
    (["--rates", "0"], "--rates must each be in (0, 1]"),
    (["--epsilons", "-1"], "--epsilons / --attack_steps: epsilons must be finite numbers > 0"),
    (["--budget", "0"], "--budget must be >= 1"),
    (["--families", "char,fonts"], "--families: 'fonts' is not one of"),
    (["--tasks", "qa"], "--tasks: 'qa' is not one of sst, qqp, sts"),
    (["--batch_size", "0"], "--batch_size must be >= 1, got 0"),
    # a family's flag typed while no family asked for reads it
    (["--families", "char", "--epsilons", "0.1"], "--epsilons would do nothing with --families char: only the "
                                                  "embedding family uses it"),
    (["--families", "char", "--attack_steps", "3"], "--attack_steps would do nothing with --families char: only the "
                                                    "embedding family uses it"),
    (["--families", "char", "--budget", "10"], "--budget would do nothing with --families char: only the greedy "
                                               "family uses it"),
    (["--families", "char", "--regression_margin", "0.5"], "--regression_margin would do nothing with --families "
                                                           "char: only the greedy family uses it"),
    (["--families", "char", "--max_examples", "20", "--attack_examples", "50"],
     "--attack_examples would do nothing with --families char: only the embedding and greedy families use it"),
    (["--families", "char,embedding", "--neighbours", "3"], "--neighbours would do nothing with --families "
                                                            "char,embedding: only the word and greedy families use it"),
    (["--tasks", "sst,qqp", "--regression_margin", "0.5"], "--regression_margin would do nothing with --tasks "
                                                           "sst,qqp: only a task scored as a number (sts) reads it"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, problem):
    import robustness
    with pytest.raises(SystemExit) as stopped:
        robustness.main([str(tmp_path), *flags])
    assert stopped.value.code == 2 and problem in capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_inputs_are_one_line_and_exit_2_before_the_model_loads(tmp_path, tiny_checkpoint, capsys,
                                                                   checkpoint_must_not_load):
    import robustness
    run = tiny_run(tmp_path / "run", tiny_checkpoint, 1)
    bad_manifest = tmp_path / "sets"
    bad_manifest.mkdir()
    (bad_manifest / "manifest.json").write_text("{not json")
    (tmp_path / "no_data").mkdir()
    cases = [([str(tmp_path / "missing")], "neither a run's folder nor a checkpoint"),
             ([str(run), "--data_dir", str(tmp_path / "no_data")], "ids-sst-dev.csv: file not found"),
             ([str(run), "--perturbed_dir", str(bad_manifest)], "manifest.json: not a manifest of perturbed sets")]
    for argv, problem in cases:
        assert robustness.main([*argv, "--quiet"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and problem in lines[0], lines


@pytest.mark.parametrize("flag, folder", [("--output_dir", "robustness"), ("--perturbed_dir", "new_sets")])
def test_another_runs_folder_is_never_written_into(tmp_path, tiny_checkpoint, capsys, checkpoint_must_not_load,
                                                    flag, folder):
    """Scoring one run into another's folder (its robustness/, or perturbed sets made there) would replace that
    run's results: refused in one line before the model loads; the run's own folder is where they go by default."""
    import robustness
    run, other = tiny_run(tmp_path / "run", tiny_checkpoint, 1), tiny_run(tmp_path / "other", tiny_checkpoint, 2)
    (other / "robustness").mkdir()
    (other / "robustness" / "robustness.json").write_text("other's")
    assert robustness.main([str(run), flag, str(other / folder), *SCRIPT_FLAGS]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: {flag} {other / folder}: inside the run folder {other}, whose files belong to that run; "
                     "write elsewhere"]
    assert (other / "robustness" / "robustness.json").read_text() == "other's"
    assert not (other / "new_sets").exists() and not (run / "robustness").exists()


@pytest.mark.parametrize("flags, problem", [
    (["--seed", "3"], "--seed would do nothing: these perturbed sets were made with --seed 0"),
    (["--rates", "0.1", "0.2"], "--rates would do nothing: these perturbed sets were made with --rates 0.2"),
    (["--max_examples", "0"], "--max_examples would do nothing: these perturbed sets were made with --max_examples "
                              "20"),
])
def test_a_set_flag_that_existing_sets_would_ignore_is_refused_before_the_model_loads(
        tmp_path, tiny_checkpoint, capsys, checkpoint_must_not_load, flags, problem):
    """The sets' manifest decides the seed, rates and subset they were made with; the same values are accepted."""
    import robustness
    from minbert.robustness.perturbed_sets import FORMAT, MANIFEST
    run, sets = tiny_run(tmp_path / "run", tiny_checkpoint, 1), tmp_path / "sets"
    sets.mkdir()
    (sets / MANIFEST).write_text(json.dumps({"format": FORMAT, "seed": 0, "max_examples": 20, "tasks": {},
                                             "variants": {"char_swap-0.2": {"rate": 0.2}}}))
    assert robustness.main([str(run), "--perturbed_dir", str(sets), *flags, "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {sets}: {problem}"), lines
    with pytest.raises(DataError, match="holds no sst, qqp, sts sets"):  # past the check, to reading the sets
        robustness.check_inputs(robustness.parse_args([str(run), "--perturbed_dir", str(sets), "--seed", "0",
                                                       "--rates", "0.2", "--max_examples", "20"]))


def test_a_familys_flag_is_accepted_with_a_family_that_reads_it(tmp_path):
    import robustness
    for families, flags in (("embedding", ["--epsilons", "0.1", "--attack_steps", "3", "--attack_examples", "5"]),
                            ("word", ["--neighbours", "3"]),
                            ("greedy", ["--budget", "10", "--regression_margin", "0.5", "--neighbours", "3"])):
        robustness.parse_args([str(tmp_path), "--families", families, *flags])


@pytest.mark.parametrize("made", [True, False])
def test_more_attack_examples_than_the_sets_hold_are_refused_before_the_model_loads(
        tmp_path, tiny_checkpoint, capsys, checkpoint_must_not_load, made):
    """The attacks run on the first examples of the sets' subset: more than it holds would do nothing, whether the
    sets are to be made (--max_examples) or read (their manifest); as many is accepted."""
    import robustness
    from minbert.robustness.perturbed_sets import FORMAT, MANIFEST
    run, sets = tiny_run(tmp_path / "run", tiny_checkpoint, 1), tmp_path / "sets"
    if not made:
        sets.mkdir()
        (sets / MANIFEST).write_text(json.dumps({"format": FORMAT, "seed": 0, "max_examples": 20, "tasks": {},
                                                 "variants": {"char_swap-0.2": {"rate": 0.2}}}))
    subset = ["--max_examples", "20"] if made else []
    assert robustness.main([str(run), "--perturbed_dir", str(sets), *subset, "--attack_examples", "50",
                            "--quiet"]) == 2
    source = "--max_examples" if made else MANIFEST
    assert capsys.readouterr().err.splitlines() == [
        f"error: {sets}: --attack_examples 50 would do nothing: the attacks run on the first examples of the perturbed "
        f"sets, 20 a task here ({source}); name at most 20"]
    if not made:  # past the check, to reading the sets
        with pytest.raises(DataError, match="holds no sst, qqp, sts sets"):
            robustness.check_inputs(robustness.parse_args([str(run), "--perturbed_dir", str(sets),
                                                           "--attack_examples", "20"]))


def test_the_results_and_the_perturbed_sets_are_refused_one_folder(tmp_path, tiny_checkpoint, capsys,
                                                                     checkpoint_must_not_load):
    """Making the sets in the results' own folder once said another process was writing there (the folder's lock,
    taken twice); the sets are every run's inputs, the results one run's: two folders."""
    import robustness
    run, folder = tiny_run(tmp_path / "run", tiny_checkpoint, 1), tmp_path / "both"
    assert robustness.main([str(run), "--output_dir", str(folder), "--perturbed_dir", str(tmp_path / "." / "both"),
                            *SCRIPT_FLAGS]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --output_dir {folder}: the same folder as --perturbed_dir; the perturbed sets are read there by every "
        "run scored on them, the results are this run's: name another --output_dir (by default RUN/robustness)"]
    assert not folder.exists()


@pytest.mark.parametrize("flag, where", [("--output_dir", "data"), ("--output_dir", "data/results"),
                                         ("--output_dir", "."), ("--perturbed_dir", "data"),
                                         ("--perturbed_dir", "data/sets")])
def test_the_data_folder_the_sets_are_made_from_is_never_written_into(tmp_path, tiny_checkpoint, capsys,
                                                                      checkpoint_must_not_load, flag, where):
    """The results or the sets in the data folder (or below it, or in a folder holding it) would land among the
    user's dev files: refused in one line before the model loads, nothing written."""
    import shutil
    import robustness
    run, data = tiny_run(tmp_path / "run", tiny_checkpoint, 1), tmp_path / "work" / "data"
    shutil.copytree(DEMO, data)
    def tree():  # new folders too
        return {path: path.is_file() and path.read_bytes() for path in (tmp_path / "work").rglob("*")}
    before = tree()
    folder = tmp_path / "work" / where
    assert robustness.main([str(run), "--data_dir", str(data), flag, str(folder), *SCRIPT_FLAGS]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag} {folder}: ") and str(data) in lines[0], lines
    assert tree() == before


def test_a_fresh_training_run_removes_what_robustness_wrote_in_its_folder(tmp_path, tiny_checkpoint):
    """Audit: a run trained again in its folder kept RUN/robustness, so robustness.py read RUN/robustness/perturbed
    (word_neighbour texts from the old model's embeddings) and the old robustness.md/json stood as the new model's.
    Every file robustness.py writes there is one a fresh run removes (run_files.robustness_files); a user's is not."""
    import robustness
    from minbert.run.run_files import earlier_run_files
    run = tiny_run(tmp_path / "a", tiny_checkpoint, 1)
    assert robustness.main([str(run), *SCRIPT_FLAGS]) == 0
    written = {path for path in (run / "robustness").rglob("*") if path.is_file() and path.name != ".lock"}
    assert {"robustness.json", "manifest.json", "greedy-sst.jsonl"} <= {path.name for path in written}
    assert any(path.parent.name == "word_neighbour-0.2" for path in written)
    mine = run / "robustness" / "notes.md"
    mine.write_text("mine")
    removed = set(earlier_run_files(run, []))
    assert written <= removed and mine not in removed


def test_sets_made_by_an_earlier_model_of_the_same_run_are_refused(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    """Audit: RUN/robustness/perturbed was read back after RUN's kept model changed (trained again, resumed), its
    word_neighbour texts the old model's neighbours. The manifest records the SHA-256 of the weights that made them:
    another model of the same run folder is one line naming the manifest, exit 2, before the model loads; another run
    reading the sets (a shared --perturbed_dir) still does, as the studies do on purpose."""
    import robustness
    from minbert.run import kept_ensemble
    first, second = tiny_run(tmp_path / "a", tiny_checkpoint, 1), tiny_run(tmp_path / "b", tiny_checkpoint, 2)
    flags = ["--families", "char,word", *SET_FLAGS, "--neighbours", "3"]
    assert robustness.main([str(first), *flags]) == 0
    sets = first / "robustness" / "perturbed"
    manifest = json.loads((sets / "manifest.json").read_text())
    assert manifest["source"]["run_sha256"] == json.loads((first / "best.json").read_text())["sha256"]
    for path in first.glob("best.*"):  # trained again: another kept model in the same folder
        path.unlink()
    tiny_run(tmp_path / "c", tiny_checkpoint, 3)
    for path in (tmp_path / "c").glob("best.*"):
        path.rename(first / path.name)
    real = kept_ensemble.load_multitask_checkpoint

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the sets were checked")
    monkeypatch.setattr(kept_ensemble, "load_multitask_checkpoint", refuse)
    capsys.readouterr()
    assert robustness.main([str(first), "--perturbed_dir", str(sets), *flags, "--output_dir",
                            str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {sets / 'manifest.json'}: ") and "made from" in err[0] \
        and "trained again since" in err[0], err
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(kept_ensemble, "load_multitask_checkpoint", real)
    assert robustness.main([str(second), "--perturbed_dir", str(sets), *flags]) == 0  # another run: read on purpose
