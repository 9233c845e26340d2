"""squad.py: the official SQuAD 2.0 metric, reading the JSON files, windows over long contexts and their
labels, span decoding and the no-answer threshold; the demo SQuAD files; download_data.py --squad.

Real-data checks read ../shared/data/squad (the project's protocol split of the official dev set) and skip
without it."""
import json
import os
import re
import urllib.error

import download_data
import numpy as np
import pytest
import torch

from conftest import DEMO
from minbert.data import demo_squad
from minbert.files import DataError
from minbert.tasks.squad import (NO_ANSWER, Answer, QAExample, QAWindows, best_threshold, decode_answers, exact_match,
                                 f1_score, load_squad, normalize_answer, predictions, squad_metrics)

MAX_QUESTION_TOKENS = 64


@pytest.fixture(scope="session")
def squad_dir(shared_dir):
    path = shared_dir / "data" / "squad"
    if not path.is_dir():
        pytest.skip("../shared/data/squad is not present")
    return path


def example(qid="q1", question="who built the blue house?", context="bob built the blue house.", answers=(),
            impossible=None) -> QAExample:
    if impossible is None:
        impossible = not answers
    return QAExample(qid, question, context, tuple(answers), impossible)


def answer_at(context: str, text: str) -> tuple[str, int]:
    return text, context.index(text)


# ---- the official metric ------------------------------------------------------------------------------

def test_normalisation_lowercases_and_drops_punctuation_articles_and_extra_whitespace():
    assert normalize_answer("  The  Quick, Brown-Fox!\n") == "quick brownfox"  # punctuation deleted, not spaced
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("A Theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("The.") == ""


def test_exact_match_after_normalisation_and_over_several_gold_answers():
    assert exact_match("the Eiffel Tower.", ["Eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match("Red Barn", ["blue house", "a red barn"]) == 1.0


def test_token_f1_on_partial_overlap_by_hand():
    # prediction {big, red, barn}, gold {red, barn, door}: 2 shared, precision = recall = 2/3
    assert f1_score("the big red barn", ["red barn door"]) == pytest.approx(2 / 3)
    # precision 1, recall 1/4: F1 = 2 * 1 * 0.25 / 1.25
    assert f1_score("barn", ["big red barn door"]) == pytest.approx(0.4)
    # tokens are counted as a multiset: "red red" shares 2 tokens with "red red barn": P 1, R 2/3
    assert f1_score("red red", ["red red barn"]) == pytest.approx(0.8)
    assert f1_score("red red barn", ["red barn barn"]) == pytest.approx(2 / 3)  # red x2 vs x1, barn x1 vs x2
    assert f1_score("green", ["red barn"]) == 0.0


def test_f1_keeps_the_best_gold_answer():
    # vs "red barn door": P 1, R 2/3 -> 0.8; vs "barn": P 1/2, R 1 -> 2/3; vs "blue house": 0
    assert f1_score("red barn", ["blue house", "red barn door", "barn"]) == pytest.approx(0.8)


def test_an_unanswerable_question_scores_only_the_empty_answer():
    assert exact_match("", [""]) == f1_score("", [""]) == 1.0
    assert exact_match("the", [""]) == f1_score("The.", [""]) == 1.0  # normalises to nothing: "no answer"
    assert exact_match("paris", [""]) == f1_score("paris", [""]) == 0.0
    assert f1_score("", ["paris"]) == 0.0


def test_gold_texts_drop_answers_that_normalise_to_nothing():
    context = "the tower, in paris"
    assert example(answers=[answer_at(context, "the"), answer_at(context, "paris")], context=context).gold_texts \
        == ["paris"]
    assert example(answers=[]).gold_texts == [""]


def test_squad_metrics_over_all_and_per_answerability():
    context = "bob built the blue house in paris."
    examples = [example("a", context=context, answers=[answer_at(context, "bob")]),
                example("b", context=context, answers=[answer_at(context, "blue house")]),
                example("c", context=context), example("d", context=context)]
    predicted = {"a": "Bob", "b": "house", "c": "", "d": "paris"}
    # a: EM 1 F1 1; b: EM 0, F1 2 * 1 * 0.5 / 1.5 = 2/3; c: 1 1; d: 0 0
    metrics = squad_metrics(predicted, examples)
    assert metrics == pytest.approx({"em": 2 / 4, "f1": (1 + 2 / 3 + 1) / 4, "has_answer_em": 1 / 2,
                                     "has_answer_f1": (1 + 2 / 3) / 2, "no_answer_em": 1 / 2, "no_answer_f1": 1 / 2})
    assert set(squad_metrics({"a": "bob"}, examples[:1])) == {"em", "f1", "has_answer_em", "has_answer_f1"}
    with pytest.raises(ValueError, match="no prediction for 1 question.*d"):
        squad_metrics({k: v for k, v in predicted.items() if k != "d"}, examples)


# ---- reading the files: bad input ----------------------------------------------------------------------

CONTEXT = "Bob built the blue house in 1901."


def write_squad(tmp_path, qas, context=CONTEXT, name="train-v2.0.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}))
    return path


def good_question(qid="5733be284776f41900661182", **changes):
    qa = {"question": "Who built the blue house?", "id": qid, "answers": [{"text": "Bob", "answer_start": 0}],
          "is_impossible": False}
    return {**qa, **changes}


def test_a_valid_file_reads_every_question_with_its_answers(tmp_path):
    path = write_squad(tmp_path, [good_question("a"), good_question("b", answers=[], is_impossible=True,
                                                                     plausible_answers=[{"text": "1901",
                                                                                         "answer_start": 28}])])
    first, second = load_squad(path, "train")
    assert (first.id, first.context, first.answers, first.is_impossible) == ("a", CONTEXT, (("Bob", 0),), False)
    assert (second.answers, second.is_impossible, second.gold_texts) == ((), True, [""])
    questions_only = write_squad(tmp_path, [{"question": "Who?", "id": "c"}], name="test-v2.0.json")
    assert load_squad(questions_only, "test")[0].is_impossible is None


def assert_data_error(path, split, *fragments):
    with pytest.raises(DataError) as error:
        load_squad(path, split)
    message = str(error.value)
    assert str(path) in message and "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_malformed_json_names_the_file(tmp_path):
    path = tmp_path / "dev-v2.0.json"
    path.write_text('{"version": "v2.0", "data": [')
    assert_data_error(path, "dev", "not a SQuAD JSON file")


def test_an_empty_file_or_one_without_questions_is_an_error(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert_data_error(empty, "train", "not a SQuAD JSON file")
    no_questions = tmp_path / "none.json"
    no_questions.write_text(json.dumps({"version": "v2.0", "data": []}))
    assert_data_error(no_questions, "train", "no questions")
    assert_data_error(tmp_path / "absent.json", "train", "file not found")


@pytest.mark.parametrize("field", ["question", "answers", "is_impossible"])
def test_a_missing_question_field_names_the_question(tmp_path, field):
    qa = good_question("5733be284776f41900661182")
    del qa[field]
    assert_data_error(write_squad(tmp_path, [qa]), "train", "5733be284776f41900661182", repr(field))


def test_a_missing_context_names_its_paragraph(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"qas": [good_question()]}]}]}))
    assert_data_error(path, "train", "article 0 paragraph 0", "'context'")


def test_an_answer_start_that_does_not_match_its_text(tmp_path):
    qa = good_question("q-off-by-one", answers=[{"text": "Bob", "answer_start": 1}])
    assert_data_error(write_squad(tmp_path, [qa]), "train", "q-off-by-one", "'Bob'", "answer_start 1", "'ob '")


def test_an_answer_start_counted_from_the_end_of_the_context_is_refused(tmp_path):
    # context[-5:-1] is "1901": a slice check alone would accept it and train the question as unanswerable
    qa = good_question("q-negative", answers=[{"text": "1901", "answer_start": -5}])
    assert_data_error(write_squad(tmp_path, [qa]), "train", "q-negative", "answer_start -5", "outside its context")
    past_the_end = good_question("q-past", answers=[{"text": "1901.", "answer_start": len(CONTEXT) - 4}])
    assert_data_error(write_squad(tmp_path, [past_the_end]), "dev", "q-past", "outside its context")


def test_a_deeply_nested_file_is_a_data_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "nested.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert_data_error(path, "train", "nested too deeply")


def test_a_fifo_or_a_folder_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "train-v2.0.json"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    assert_data_error(fifo, "train", "not a regular file")
    assert_data_error(tmp_path, "train", "not a regular file")


def test_an_answerable_question_needs_answers_and_an_unanswerable_one_none(tmp_path):
    assert_data_error(write_squad(tmp_path, [good_question("q-empty", answers=[])]), "train", "q-empty",
                      "answerable but has no answers")
    assert_data_error(write_squad(tmp_path, [good_question("q-both", is_impossible=True)]), "train", "q-both",
                      "unanswerable")


def test_a_repeated_id_is_an_error(tmp_path):
    assert_data_error(write_squad(tmp_path, [good_question("twice"), good_question("twice")]), "train", "twice",
                      "more than once")


# ---- windows -------------------------------------------------------------------------------------------

def check_windows(windows: QAWindows, tokenizer) -> dict:
    """Check every window of every question against the tokenizer's own view of question and context:
    layout [CLS] question [SEP] piece [SEP], geometry (first window at 0, consecutive ones overlapping by
    exactly doc_stride tokens, all but the last full, the last at the context's end, none over max_length)
    and labels (the first gold answer's tokens when wholly inside the piece, else [CLS]; the text under
    the labelled offsets holds the answer, and is it exactly when the answer starts and ends on token
    boundaries). Returns counts for the callers' own checks."""
    examples = windows.examples
    questions = tokenizer.encode_with_offsets([e.question for e in examples])
    contexts = {}
    by_question: dict[int, list] = {}
    for window in windows:
        by_question.setdefault(window.example, []).append(window)
    stats = dict(questions=len(by_question), windows=len(windows), answerable=0, labelled_questions=0,
                 unaligned_answers=0, long_answers_unlabelled=0, labelled_in_later_window=0)
    cls, sep, stride = tokenizer.cls_token_id, tokenizer.sep_token_id, windows.doc_stride
    assert sorted(by_question) == list(range(len(examples)))
    for index, group in by_question.items():
        e = examples[index]
        if e.context not in contexts:
            contexts[e.context] = tokenizer.encode_with_offsets([e.context])[0]
        context_ids, offsets = contexts[e.context]
        question_ids = questions[index][0][:MAX_QUESTION_TOKENS]
        room = windows.max_length - len(question_ids) - 3
        gold = None
        if e.answers:
            stats["answerable"] += 1
            text, start = e.answers[0]
            end = start + len(text)
            covered = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
            gold = covered[0], covered[-1]
            aligned = offsets[gold[0]][0] == start and offsets[gold[1]][1] == end
            stats["unaligned_answers"] += not aligned
        first = 0
        labelled = False
        for number, window in enumerate(group):
            piece = len(window.offsets)
            assert window.id == f"{e.id}#{number}"
            assert len(window.input_ids) <= windows.max_length
            assert window.context_start == len(question_ids) + 2
            assert window.input_ids == (cls, *question_ids, sep, *context_ids[first:first + piece], sep)
            assert window.offsets == tuple(tuple(o) for o in offsets[first:first + piece])
            last = number == len(group) - 1
            assert piece == (len(context_ids) - first if last else room)
            if gold is not None and first <= gold[0] and gold[1] < first + piece:
                expected = (gold[0] - first + window.context_start, gold[1] - first + window.context_start)
                assert window.label == expected
                under = e.context[window.offsets[expected[0] - window.context_start][0]:
                                  window.offsets[expected[1] - window.context_start][1]]
                assert text in under
                assert under == text or not aligned
                labelled = True
                stats["labelled_in_later_window"] += number > 0
            else:
                assert window.label == NO_ANSWER
            first += piece - stride  # the next window starts doc_stride tokens before this one's end
        assert first + stride == len(context_ids) or (len(context_ids) == 0 and len(group) == 1)
        stats["labelled_questions"] += labelled
        if gold is not None and not labelled:
            # Geometry guarantees a window holding any answer of at most doc_stride + 1 tokens.
            assert gold[1] - gold[0] + 1 > stride + 1, f"{e.id}: a short answer in no window"
            stats["long_answers_unlabelled"] += 1
    return stats


@pytest.fixture(scope="module")
def demo_train():
    return load_squad(DEMO / "train-v2.0.json", "train")


@pytest.fixture(scope="module")
def demo_dev():
    return load_squad(DEMO / "dev-v2.0.json", "dev")


@pytest.mark.parametrize("max_length, doc_stride", [(384, 128), (64, 16)])
def test_demo_windows_reproduce_the_gold_answers(demo_train, demo_dev, tokenizer, max_length, doc_stride):
    for examples in (demo_train, demo_dev):
        stats = check_windows(QAWindows.build(examples, tokenizer, max_length, doc_stride), tokenizer)
        assert stats["labelled_questions"] == stats["answerable"] > 0
        assert stats["unaligned_answers"] == 0  # the demo's answers are whole words
        if max_length == 64:
            assert stats["windows"] > 2 * stats["questions"]
            assert stats["labelled_in_later_window"] > 0


def test_windows_of_a_long_context_and_a_long_question(tokenizer):
    context = " ".join(f"word{i}" for i in range(60)) + " the answer is here ."
    question = "why " * 80 + "?"  # cut to MAX_QUESTION_TOKENS
    e = example(question=question, context=context, answers=[answer_at(context, "answer is here")])
    windows = QAWindows.build([e], tokenizer, max_length=100, doc_stride=10)
    stats = check_windows(windows, tokenizer)
    assert stats["windows"] > 3 and stats["labelled_questions"] == 1


@pytest.mark.parametrize("split, max_length, doc_stride", [("train", 384, 128), ("dev", 384, 128),
                                                           ("train", 128, 32), ("dev", 128, 32)])
def test_real_windows_reproduce_the_gold_answers(squad_dir, tokenizer, split, max_length, doc_stride):
    examples = load_squad(squad_dir / f"{split}-v2.0.json", split)
    stats = check_windows(QAWindows.build(examples, tokenizer, max_length, doc_stride), tokenizer)
    if max_length == 384:
        assert stats["labelled_questions"] == stats["answerable"] > 1000
    else:  # several windows per question; only answers longer than the overlap can fall in none
        assert stats["windows"] > 1.5 * stats["questions"] and stats["labelled_in_later_window"] > 500
        assert stats["labelled_questions"] + stats["long_answers_unlabelled"] == stats["answerable"]
        assert stats["long_answers_unlabelled"] < 0.01 * stats["answerable"]
    # A few answers start or end inside a word piece (e.g. 'y through the port...' inside 'probably'):
    # their labelled text holds them without equalling them.
    assert stats["unaligned_answers"] < 0.005 * stats["answerable"]


def test_a_short_context_gives_one_window_per_question(tokenizer):
    context = "bob built the blue house."
    examples = [example("a", context=context, answers=[answer_at(context, "bob")]), example("b", context=context)]
    windows = QAWindows.build(examples, tokenizer, max_length=384, doc_stride=128)
    assert [w.id for w in windows] == ["a#0", "b#0"]
    assert windows[0].label == (windows[0].context_start, windows[0].context_start)
    assert windows[1].label == NO_ANSWER
    check_windows(windows, tokenizer)


def test_a_stride_that_leaves_no_progress_is_refused(tokenizer):
    e = example(question="who built the blue house?")  # 6 tokens: 20 - 6 - 3 = 11 context tokens per window
    with pytest.raises(ValueError, match="--qa_max_length 20 leaves 11 context tokens.*--qa_doc_stride 11"):
        QAWindows.build([e], tokenizer, max_length=20, doc_stride=11)
    assert len(QAWindows.build([e], tokenizer, max_length=20, doc_stride=10)) == 1
    with pytest.raises(ValueError, match="no questions"):
        QAWindows.build([], tokenizer)


def test_collate_segments_masks_and_labels(demo_train, tokenizer):
    windows = QAWindows.build(demo_train[:12], tokenizer, max_length=64, doc_stride=16)
    batch = windows.collate(range(len(windows)))
    lengths = [len(w.input_ids) for w in windows]
    assert batch["input_ids"].shape == (len(windows), max(lengths)) and min(lengths) < max(lengths)
    assert batch["labels"].shape == (len(windows), 2) and batch["labels"].dtype == torch.long
    assert batch["labels"].tolist() == [list(w.label) for w in windows]
    assert batch["ids"] == [w.id for w in windows]
    for row, length in enumerate(lengths):
        ids, types = batch["input_ids"][row].tolist(), batch["token_type_ids"][row].tolist()
        first_sep = ids.index(tokenizer.sep_token_id)
        assert types == [0] * (first_sep + 1) + [1] * (length - first_sep - 1) + [0] * (max(lengths) - length)
        assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (max(lengths) - length)
        assert ids[length - 1] == tokenizer.sep_token_id and ids[length:] == [tokenizer.pad_token_id] * (
            max(lengths) - length)
    test_windows = QAWindows.build(load_squad(DEMO / "test-v2.0.json", "test")[:3], tokenizer)
    assert test_windows.collate([0, 1])["labels"] is None


# ---- decoding ------------------------------------------------------------------------------------------

DECODE_CONTEXT = "alice built the red house near the river and bob built the blue house near the lake"


@pytest.fixture
def two_windows(tokenizer):
    """One question whose 17-word context is read in two windows, words 0-11 and 5-16 ("near the river
    and bob built the blue house near the lake"), and a second question with one window."""
    e = example("q", question="who built the blue house?", context=DECODE_CONTEXT)
    other = example("r", question="who?", context="carol did.")
    windows = QAWindows.build([e, other], tokenizer, max_length=21, doc_stride=7)
    assert [w.id for w in windows] == ["q#0", "q#1", "r#0"]
    assert [len(w.offsets) for w in windows] == [12, 12, 3]
    return windows


def position(window, word: str, occurrence: int = 0) -> int:
    """The window position of a context word (every word here is one token)."""
    words = [DECODE_CONTEXT[a:b] for a, b in window.offsets]
    matches = [i for i, w in enumerate(words) if w == word]
    return window.context_start + matches[occurrence]


def empty_logits(windows, extra: int = 3) -> np.ndarray:
    """Zeros over every window, with traps outside the contexts: high scores on the question, the
    separators and padding past a window's length."""
    logits = np.zeros((len(windows), max(len(w.input_ids) for w in windows) + extra, 2), dtype=np.float32)
    for row, window in enumerate(windows):
        logits[row, 1:window.context_start] = 50.0  # question and first [SEP]
        logits[row, len(window.input_ids) - 1] = 50.0  # the last [SEP]
        logits[row, len(window.input_ids):] = 100.0  # padding
    return logits


def test_decoding_keeps_the_best_span_over_a_questions_windows(two_windows):
    first, second, _ = two_windows
    logits = empty_logits(two_windows)
    logits[0, position(first, "alice"), :] = 3.0  # "alice": 6 in window 0
    logits[1, position(second, "bob"), 0] = 5.0  # "bob built the blue house": 9 in window 1
    logits[1, position(second, "house"), 1] = 4.0
    logits[0, 0] = 0.5  # [CLS] 1 in window 0: the no-answer score is the lower one
    logits[1, 0] = 1.0  # [CLS] 2 in window 1
    answers = decode_answers(two_windows, logits)
    assert answers["q"] == Answer("bob built the blue house", pytest.approx(1.0 - 9.0))
    assert set(answers) == {"q", "r"}


def test_decoding_needs_end_after_start(two_windows):
    first = two_windows[0]
    logits = empty_logits(two_windows)
    logits[0, position(first, "red"), 0] = 10.0
    logits[0, position(first, "the"), 1] = 10.0  # before "red": (red, the) is no span
    logits[0, position(first, "house"), 1] = 1.0
    answers = decode_answers(two_windows, logits)
    assert answers["q"].text == "red house"
    assert answers["q"].margin == pytest.approx(0.0 - 11.0)


def test_decoding_respects_max_answer_tokens(two_windows):
    first = two_windows[0]
    logits = empty_logits(two_windows)
    logits[0, position(first, "alice"), 0] = 5.0
    logits[0, position(first, "house"), 1] = 5.0  # "alice built the red house": 5 tokens, 10
    logits[0, position(first, "built"), 1] = 2.0  # "alice built": 2 tokens, 7
    assert decode_answers(two_windows, logits, max_answer_tokens=5)["q"].text == "alice built the red house"
    assert decode_answers(two_windows, logits, max_answer_tokens=4)["q"].text == "alice built"
    assert decode_answers(two_windows, logits, max_answer_tokens=1)["q"].text == "alice"


def test_decoding_never_answers_outside_the_context(two_windows):
    logits = empty_logits(two_windows) - 1.0  # every context position scores -2
    answers = decode_answers(two_windows, logits)
    for qid, answer in answers.items():
        assert answer.text and answer.text in DECODE_CONTEXT + " carol did."
        assert answer.margin == pytest.approx(-2.0 - -2.0)  # [CLS] -1 -1 against the best span's -1 -1
    assert answers["r"].text in {"carol", "did", "."}


def test_predictions_answer_nothing_above_the_threshold():
    answers = {"a": Answer("paris", -1.0), "b": Answer("rome", 0.5), "c": Answer("oslo", 2.0)}
    assert predictions(answers) == {"a": "paris", "b": "", "c": ""}
    assert predictions(answers, threshold=0.5) == {"a": "paris", "b": "rome", "c": ""}  # margin > tau: no answer
    assert predictions(answers, threshold=-1.5) == {"a": "", "b": "", "c": ""}


# ---- the no-answer threshold ---------------------------------------------------------------------------

def threshold_case(rows):
    """rows: (id, gold answer or None, predicted text, margin) -> examples, answers."""
    examples, answers = [], {}
    for qid, gold, text, margin in rows:
        context = f"{gold or 'nothing'} here."
        examples.append(example(qid, context=context, answers=[answer_at(context, gold)] if gold else []))
        answers[qid] = Answer(text, margin)
    return examples, answers


def best_f1_by_brute_force(answers, examples) -> float:
    taus = [-np.inf] + [a.margin for a in answers.values()]
    return max(squad_metrics(predictions(answers, tau), examples)["f1"] for tau in taus)


def test_best_threshold_by_hand():
    # From "no answer" everywhere (the two unanswerable score 2), answering in margin order gains
    # a +1 (score 3), b -1 (2), c +2/3 (2.67), d -1 (1.67): the best is to answer a only, tau = a's margin.
    examples, answers = threshold_case([("a", "paris", "paris", -2.0), ("b", None, "rome", 0.5),
                                        ("c", "red barn", "red", 1.0), ("d", None, "x", 3.0)])
    tau = best_threshold(answers, examples)
    assert tau == -2.0
    assert predictions(answers, tau) == {"a": "paris", "b": "", "c": "", "d": ""}
    assert squad_metrics(predictions(answers, tau), examples)["f1"] == 0.75 == best_f1_by_brute_force(answers,
                                                                                                      examples)


def test_best_threshold_answers_through_a_loss_when_it_pays():
    # a +1 (3), b -1 (2), c +1 (3, a tie: the lower tau stays), e +1 (4): tau = e's margin.
    examples, answers = threshold_case([("a", "paris", "paris", -2.0), ("b", None, "rome", 0.5),
                                        ("c", "oslo", "oslo", 1.0), ("d", None, "x", 3.0), ("e", "bern", "bern", 1.5)])
    assert best_threshold(answers, examples) == 1.5
    examples, answers = threshold_case([("a", "paris", "paris", -2.0), ("b", None, "rome", 0.5),
                                        ("c", "oslo", "oslo", 1.0), ("d", None, "x", 3.0)])
    assert best_threshold(answers, examples) == -2.0  # the tie at c keeps the lower tau
    assert squad_metrics(predictions(answers, -2.0), examples)["f1"] == best_f1_by_brute_force(answers, examples)


def test_best_threshold_answers_nothing_when_answering_never_gains():
    examples, answers = threshold_case([("a", "paris", "rome", 0.3), ("b", None, "x", -1.0), ("c", None, "y", 2.0)])
    tau = best_threshold(answers, examples)
    assert tau < -1.0
    assert set(predictions(answers, tau).values()) == {""}
    with pytest.raises(ValueError, match="no questions"):
        best_threshold({}, [])


def test_best_threshold_with_equal_margins_chooses_a_reachable_score():
    # a +1, b -1, c -1 all at margin 1.0: a threshold answers the three together or none of them. Scored one by
    # one (as the official script does) a "alone" would look best (3 of 3), and tau = 1.0 answers b and c too.
    examples, answers = threshold_case([("a", "paris", "paris", 1.0), ("b", None, "x", 1.0), ("c", None, "y", 1.0)])
    tau = best_threshold(answers, examples)
    assert squad_metrics(predictions(answers, tau), examples)["f1"] == best_f1_by_brute_force(answers, examples)


# ---- the demo files -------------------------------------------------------------------------------------

def test_demo_squad_files_look_like_the_official_ones(demo_train, demo_dev, tokenizer):
    test = load_squad(DEMO / "test-v2.0.json", "test")
    assert (len(demo_train), len(demo_dev), len(test)) == (120, 40, 40)
    ids = [e.id for e in demo_train + demo_dev + test]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)
    for examples in (demo_train, demo_dev):
        assert sum(e.is_impossible for e in examples) == len(examples) // 2
    assert any(len({text for text, _ in e.answers}) > 1 for e in demo_dev)  # differing gold spans
    assert max(len(tokenizer.tokenize(e.context)) for e in demo_train + demo_dev + test) > 120
    towns = [{e.context.split()[0] for e in split if " is a " in e.context} for split in (demo_train, demo_dev, test)]
    assert not (towns[0] & towns[1] or towns[0] & towns[2] or towns[1] & towns[2])
    document = json.loads((DEMO / "test-v2.0.json").read_text())
    qas = [qa for article in document["data"] for p in article["paragraphs"] for qa in p["qas"]]
    assert {tuple(sorted(qa)) for qa in qas} == {("id", "question")}
    document = json.loads((DEMO / "train-v2.0.json").read_text())
    qas = [qa for article in document["data"] for p in article["paragraphs"] for qa in p["qas"]]
    assert all(qa["plausible_answers"] for qa in qas if qa["is_impossible"])
    assert document["version"] == "v2.0"


def test_demo_squad_files_are_regenerated_identically(tmp_path):
    demo_squad.write_squad(tmp_path, seed=0)
    for name in ("train-v2.0.json", "dev-v2.0.json", "test-v2.0.json"):
        assert (tmp_path / name).read_bytes() == (DEMO / name).read_bytes(), name


# ---- download_data.py --squad ---------------------------------------------------------------------------

def squad_bytes(questions: int) -> bytes:
    qas = [good_question(f"q{i}") for i in range(questions)]
    return json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": CONTEXT,
                                                                                  "qas": qas}]}]}).encode()


@pytest.fixture
def course_files_present(tmp_path):
    for name in download_data.EXPECTED_ROWS:
        (tmp_path / name).write_text("kept")
    return tmp_path


def test_download_squad_writes_the_official_files_unchanged(course_files_present, monkeypatch, capsys):
    folder = course_files_present
    fetched = []

    def fetch(url, timeout=60.0):
        fetched.append(url)
        return squad_bytes(2 if "train" in url else 1)
    monkeypatch.setattr(download_data, "fetch", fetch)
    monkeypatch.setattr(download_data, "SQUAD_QUESTIONS", {"train-v2.0.json": 2, "dev-v2.0.json": 1})
    assert download_data.main(["--data_dir", str(folder)]) == 0
    assert fetched == []  # SQuAD only on request
    assert download_data.main(["--data_dir", str(folder), "--squad"]) == 0
    assert fetched == [download_data.SQUAD_URL + "train-v2.0.json", download_data.SQUAD_URL + "dev-v2.0.json"]
    assert (folder / "train-v2.0.json").read_bytes() == squad_bytes(2)
    assert not (folder / "test-v2.0.json").exists()
    assert "hidden" in capsys.readouterr().out
    assert len(load_squad(folder / "dev-v2.0.json", "dev")) == 1


def test_download_squad_checks_the_question_count(course_files_present, monkeypatch, capsys):
    monkeypatch.setattr(download_data, "fetch", lambda url, timeout=60.0: squad_bytes(3))
    assert download_data.main(["--data_dir", str(course_files_present), "--squad"]) == 1
    assert "train-v2.0.json: 3 questions, expected 130319; nothing written" in capsys.readouterr().err
    assert not (course_files_present / "train-v2.0.json").exists()
    monkeypatch.setattr(download_data, "fetch", lambda url, timeout=60.0: b"<html>not found</html>")
    assert download_data.main(["--data_dir", str(course_files_present), "--squad"]) == 1
    assert "not a SQuAD 2.0 JSON file" in capsys.readouterr().err


def test_download_squad_offline_says_where_the_files_go(course_files_present, monkeypatch, capsys):
    def offline(url, timeout=60.0):
        raise urllib.error.URLError("Name or service not known")
    monkeypatch.setattr(download_data, "fetch", offline)
    assert download_data.main(["--data_dir", str(course_files_present), "--squad"]) == 1
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "offline" in message and "rajpurkar.github.io/SQuAD-explorer" in message
    assert "train-v2.0.json" in message and "dev-v2.0.json" in message and "hidden" in message


def test_decoding_and_threshold_refuse_inputs_that_do_not_match(tokenizer):
    windows = QAWindows.build(load_squad(DEMO / "dev-v2.0.json", "dev")[:2], tokenizer, 64, 16)
    with pytest.raises(ValueError, match="rows of logits"):
        decode_answers(windows, np.zeros((len(windows) - 1, 64, 2), dtype=np.float32))
    examples, answers = threshold_case([("a", "paris", "paris", 1.0), ("b", None, "x", 2.0)])
    with pytest.raises(ValueError, match="no answer for 1 question"):
        best_threshold({"a": answers["a"]}, examples)
