"""SQuAD 2.0 extractive question answering: the official JSON files, windows over long contexts, span
decoding with a no-answer threshold, and the official metric.

    examples = load_squad(path, split)                              # one QAExample per question, validated
    windows = QAWindows.build(examples, tokenizer, max_length=384, doc_stride=128)
    loader = batches.tokenized_dataloader(windows, ...)             # input_ids, attention_mask, token_type_ids,
                                                                     # labels (B, 2): gold start / end token
    answers = decode_answers(windows, logits)                       # best span and no-answer margin per question
    threshold = best_threshold(answers, examples)                   # tau, chosen on dev to maximise F1
    metrics = squad_metrics(predictions(answers, threshold), examples)

A window is `[CLS] question [SEP] context piece [SEP]` (segment ids 0, then 1 from the context on); a
context longer than a window is read in several, each starting `doc_stride` tokens before the previous one
ended (the overlap, as `stride` in transformers' QA examples). A window whose piece does not hold the
whole gold answer is trained to point at [CLS] (position 0), as is every window of an unanswerable
question (Devlin et al. 2019, section 4.3).

Decoding (as Devlin et al. and transformers' `postprocess_qa_predictions`): in every window the n_best
start and end logits give candidate spans (both inside the context piece, end >= start, at most
max_answer_tokens long), scored start + end; the question's answer is its best span over all windows,
its no-answer score the lowest [CLS] score (start + end at position 0) over its windows. The answer is ""
when no-answer score - best span score > tau. Character offsets from the tokenizer map the span back to
the context's exact text.

The metric is the official evaluation script's (evaluate-v2.0.py): answers normalised (lower case, no
punctuation, no articles, single spaces), exact match and token F1 against each gold answer, the best
kept; an unanswerable question's only gold answer is "". Its best_f1 threshold search is best_threshold.
"""
from __future__ import annotations

import collections
import json
import math
import re
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minbert.files import DataError, atomic_write_text, read_input_bytes
from minbert.runtime import bucket_length

MAX_QUESTION_TOKENS = 64  # longer questions are cut, as in Devlin et al.'s run_squad.py
NO_ANSWER = (0, 0)  # the gold (start, end) of a window without the answer: [CLS]


@dataclass(frozen=True)
class QASettings:
    """How SQuAD is read and answered (Devlin et al.'s defaults): windows of `max_length` tokens sharing
    `doc_stride` with the one before; the `n_best` starts and ends of each window; spans of at most
    `max_answer_tokens` tokens."""
    max_length: int = 384
    doc_stride: int = 128
    n_best: int = 20
    max_answer_tokens: int = 30


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]  # (text, answer_start) of each gold answer; () when unanswerable
    is_impossible: bool | None  # None in a questions-only (test) file

    @property
    def gold_texts(self) -> list[str]:
        """What the official metric compares with: the answers' texts, or [""] for an unanswerable question."""
        texts = [text for text, _ in self.answers if normalize_answer(text)]
        return texts or [""]


# -- reading ---------------------------------------------------------------------------------------

def load_squad(path: str | Path, split: str) -> list[QAExample]:
    """Every question of an official SQuAD 2.0 JSON file ({"version", "data": [{"title", "paragraphs":
    [{"context", "qas": [{"id", "question", "answers", "is_impossible"}]}]}]}), in file order.

    split "test" reads a questions-only file (answers ignored when present). Any problem (bad JSON, a missing
    or mistyped field, an answer_start whose text is not there in the context, an answerable question without
    answers, a repeated id) is a DataError naming the file and the question id: nothing is dropped."""
    path = Path(path)
    try:
        document = json.loads(read_input_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(path, f"not a SQuAD JSON file ({err})") from None
    except RecursionError:  # json's decoder recurses once per nested list or object
        raise DataError(path, "not a SQuAD JSON file (nested too deeply to read)") from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise DataError(path, 'not a SQuAD JSON file: expected {"version": ..., "data": [articles]}')
    examples, seen = [], set()
    for a, article in enumerate(document["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataError(path, f"article {a}: no 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            where = f"article {a} paragraph {p}"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise DataError(path, f"{where}: no 'qas' list")
            context = paragraph.get("context")
            if not isinstance(context, str) or not context.strip():
                raise DataError(path, f"{where}: 'context' must be a non-empty string")
            for qa in paragraph["qas"]:
                example = _read_question(path, qa, context, split, where)
                if example.id in seen:
                    raise DataError(path, f"question {example.id}: the id appears more than once")
                seen.add(example.id)
                examples.append(example)
    if not examples:
        raise DataError(path, "no questions")
    return examples


def _read_question(path: Path, qa, context: str, split: str, where: str) -> QAExample:
    if not isinstance(qa, dict) or not isinstance(qa.get("id"), str) or not qa["id"].strip():
        raise DataError(path, f"{where}: a question without a string 'id'")
    qid = qa["id"]
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(path, f"question {qid}: 'question' must be a non-empty string")
    if split == "test":
        return QAExample(qid, question, context, (), None)
    impossible, answers = qa.get("is_impossible"), qa.get("answers")
    if not isinstance(impossible, bool):
        raise DataError(path, f"question {qid}: 'is_impossible' must be true or false")
    if not isinstance(answers, list):
        raise DataError(path, f"question {qid}: 'answers' must be a list")
    gold = []
    for answer in answers:
        text, start = (answer.get("text"), answer.get("answer_start")) if isinstance(answer, dict) else (None, None)
        if not isinstance(text, str) or not text or not isinstance(start, int) or isinstance(start, bool):
            raise DataError(path, f"question {qid}: each answer needs a non-empty 'text' and an integer 'answer_start'")
        if not 0 <= start <= len(context) - len(text):  # a slice would take a negative start from the end
            raise DataError(path, f"question {qid}: answer_start {start} of {text!r} is outside its context "
                                  f"({len(context)} characters)")
        if context[start:start + len(text)] != text:
            raise DataError(path, f"question {qid}: answer {text!r} is not at answer_start {start} of its context "
                                  f"(found {context[start:start + len(text)]!r})")
        gold.append((text, start))
    if impossible and gold:
        raise DataError(path, f"question {qid}: unanswerable (is_impossible) but has answers")
    if not impossible and not gold:
        raise DataError(path, f"question {qid}: answerable but has no answers")
    return QAExample(qid, question, context, tuple(gold), impossible)


# -- windows ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QAWindow:
    id: str  # "<question id>#<window number>"
    example: int  # index of its question in QAWindows.examples
    input_ids: tuple[int, ...]
    context_start: int  # position of the window's first context token
    offsets: tuple[tuple[int, int], ...]  # character span in the context of each context token of the window
    label: tuple[int, int]  # gold (start, end) token positions; NO_ANSWER ([CLS]) when the window lacks it


class QAWindows(Sequence):
    """The windows of a split's questions; a Sequence of QAWindow batched by tokenized_dataloader like
    datasets.TokenizedExamples (lengths for the length buckets, collate, subset; a slice is a QAWindows)."""

    def __init__(self, examples: list[QAExample], windows: list[QAWindow], pad_token_id: int, max_length: int,
                 doc_stride: int, labelled: bool):
        self.examples, self.windows = examples, windows
        self.pad_token_id, self.max_length, self.doc_stride = pad_token_id, max_length, doc_stride
        self.labelled = labelled  # batches carry labels (train and dev files; not questions-only test files)
        self.lengths = [len(w.input_ids) for w in windows]

    @classmethod
    def build(cls, examples: Sequence[QAExample], tokenizer, max_length: int = 384, doc_stride: int = 128,
              max_question_tokens: int = MAX_QUESTION_TOKENS) -> "QAWindows":
        """Tokenise every question and context once (contexts shared by questions once) and cut the windows."""
        examples = list(examples)
        if not examples:
            raise ValueError("no questions to read")
        questions = tokenizer.encode_with_offsets([e.question for e in examples])
        distinct = list(dict.fromkeys(e.context for e in examples))
        contexts = dict(zip(distinct, tokenizer.encode_with_offsets(distinct)))
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        windows = []
        for index, (example, (question_ids, _)) in enumerate(zip(examples, questions)):
            question_ids = question_ids[:max_question_tokens]
            room = _context_room(example, len(question_ids), max_length, doc_stride)
            context_ids, offsets = contexts[example.context]
            gold = _gold_token_spans(example, offsets)
            prefix = (cls_id, *question_ids, sep_id)
            for number, first in enumerate(_window_starts(len(context_ids), room, doc_stride)):
                last = min(first + room, len(context_ids))  # the piece is context tokens [first, last)
                label = NO_ANSWER
                if gold is not None and first <= gold[0] and gold[1] < last:
                    label = (gold[0] - first + len(prefix), gold[1] - first + len(prefix))
                windows.append(QAWindow(f"{example.id}#{number}", index, (*prefix, *context_ids[first:last], sep_id),
                                        len(prefix), tuple(offsets[first:last]), label))
        labelled = all(e.is_impossible is not None for e in examples)
        return cls(examples, windows, tokenizer.pad_token_id, max_length, doc_stride, labelled)

    def subset(self, indices: Sequence[int]) -> "QAWindows":
        """These windows at `indices`, in that order (their questions stay addressable by index)."""
        return QAWindows(self.examples, [self.windows[i] for i in indices], self.pad_token_id, self.max_length,
                         self.doc_stride, self.labelled)

    def collate(self, indices: Sequence[int], pad_to_multiple_of: int | None = None) -> dict:
        """Padded input_ids / attention_mask / token_type_ids (B, T) (T a bucket of `pad_to_multiple_of` tokens if
        given), each row's real-token `lengths` (on the host), labels (B, 2) or None, and window ids."""
        windows = [self.windows[i] for i in indices]
        lengths = np.array([len(w.input_ids) for w in windows], dtype=np.int64)  # (B,)
        length = bucket_length(int(lengths.max()), pad_to_multiple_of, self.max_length)
        input_ids = torch.full((len(windows), length), self.pad_token_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros_like(input_ids)
        token_type_ids = torch.zeros_like(input_ids)
        for row, window in enumerate(windows):
            input_ids[row, :len(window.input_ids)] = torch.tensor(window.input_ids)
            attention_mask[row, :len(window.input_ids)] = 1
            token_type_ids[row, window.context_start:len(window.input_ids)] = 1  # the piece and its [SEP]
        labels = torch.tensor([w.label for w in windows], dtype=torch.long) if self.labelled else None  # (B, 2)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                "lengths": lengths, "labels": labels, "ids": [w.id for w in windows]}

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.subset(range(len(self))[index])
        return self.windows[index]

    def __iter__(self) -> Iterator[QAWindow]:
        return iter(self.windows)


def check_window_room(examples: Sequence[QAExample], tokenizer, max_length: int, doc_stride: int,
                      max_question_tokens: int = MAX_QUESTION_TOKENS) -> None:
    """Refuse (ValueError) a window length that leaves no more than doc_stride context tokens beside the longest
    question: what QAWindows.build would find only while a run builds its windows."""
    lengths = [min(len(ids), max_question_tokens) for ids, _ in tokenizer.encode_with_offsets([e.question for e in examples])]
    longest = max(range(len(examples)), key=lengths.__getitem__)
    _context_room(examples[longest], lengths[longest], max_length, doc_stride)


def _context_room(example: QAExample, question_tokens: int, max_length: int, doc_stride: int) -> int:
    """The context tokens of each window of this question: [CLS] question [SEP] piece [SEP]."""
    room = max_length - question_tokens - 3
    if room <= doc_stride:
        raise ValueError(f"--qa_max_length {max_length} leaves {room} context tokens per window after "
                         f"question {example.id}, not more than --qa_doc_stride {doc_stride}; raise "
                         "the length or lower the stride")
    return room


def _window_starts(num_tokens: int, room: int, doc_stride: int) -> list[int]:
    """First context token of each window: every window but the last is full, and each starts doc_stride
    tokens before the previous one ended."""
    starts = [0]
    while starts[-1] + room < num_tokens:
        starts.append(starts[-1] + room - doc_stride)
    return starts


def _gold_token_spans(example: QAExample, offsets: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """The first gold answer's (first, last) context token: the tokens its characters overlap. None when
    the question has no answer (or no labels)."""
    if not example.answers:
        return None
    text, start = example.answers[0]
    end = start + len(text)
    covered = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    if not covered:  # only whitespace or characters the tokenizer drops; cannot happen with a non-empty answer
        return None
    return covered[0], covered[-1]


# -- decoding --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    text: str  # the best non-empty span
    margin: float  # no-answer score - best span score: the answer is "" when the margin exceeds tau


def decode_answers(windows: QAWindows, logits: np.ndarray, n_best: int = 20,
                   max_answer_tokens: int = 30) -> dict[str, Answer]:
    """Each question's best span and no-answer margin from its windows' logits (N, T, 2) (start, end;
    positions past a window's length are ignored), as the module docstring says."""
    if len(logits) != len(windows):
        raise ValueError(f"{len(logits)} rows of logits for {len(windows)} windows")
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for window, window_logits in zip(windows.windows, logits):
        length = len(window.input_ids)
        start_logits, end_logits = window_logits[:length, 0], window_logits[:length, 1]
        null_score = float(start_logits[0] + end_logits[0])
        null[window.example] = min(null.get(window.example, math.inf), null_score)
        first, last = window.context_start, window.context_start + len(window.offsets) - 1  # context positions
        starts = [i for i in np.argsort(-start_logits, kind="stable")[:n_best] if first <= i <= last]
        ends = [i for i in np.argsort(-end_logits, kind="stable")[:n_best] if first <= i <= last]
        for i in starts:
            for j in ends:
                if not i <= j < i + max_answer_tokens:
                    continue
                score = float(start_logits[i] + end_logits[j])
                if window.example not in best or score > best[window.example][0]:
                    context = windows.examples[window.example].context
                    best[window.example] = (score, context[window.offsets[i - first][0]:window.offsets[j - first][1]])
    answers = {}
    for index, null_score in null.items():
        score, text = best.get(index, (-math.inf, ""))  # no candidate within n_best: only "no answer" remains
        answers[windows.examples[index].id] = Answer(text, null_score - score)
    return answers


def predictions(answers: dict[str, Answer], threshold: float = 0.0) -> dict[str, str]:
    """{question id: answer text}, "" where the no-answer margin exceeds the threshold (the official format)."""
    return {qid: "" if answer.margin > threshold else answer.text for qid, answer in answers.items()}


def write_squad_predictions(path: str | Path, predicted: dict[str, str]) -> None:
    """The official predictions file: one JSON object {question id: answer text, "" for no answer}."""
    atomic_write_text(path, json.dumps(predicted, ensure_ascii=False, indent=0) + "\n")


def best_threshold(answers: dict[str, Answer], examples: Sequence[QAExample]) -> float:
    """The tau with the highest F1 of predictions(answers, tau) on these labelled questions (the official
    script's best_f1 search): starting from "no answer" everywhere, tau rises through the margins, each step
    answering every question of that margin (a tau answers equal margins all or none). Of equal F1 the lower
    tau is kept; with no gain every margin exceeds tau (all "no answer")."""
    if not examples:
        raise ValueError("no questions to choose a threshold on")
    missing = [e.id for e in examples if e.id not in answers]
    if missing:
        raise ValueError(f"no answer for {len(missing)} question(s), e.g. {missing[0]}")
    by_margin = sorted(examples, key=lambda e: answers[e.id].margin)
    score = best_score = sum(1.0 for e in examples if e.gold_texts == [""])  # all "": each unanswerable scores 1
    threshold = answers[by_margin[0].id].margin - 1.0
    for index, example in enumerate(by_margin):
        answer = answers[example.id]
        score += f1_score(answer.text, example.gold_texts) - f1_score("", example.gold_texts)
        last_of_its_margin = index + 1 == len(by_margin) or answers[by_margin[index + 1].id].margin > answer.margin
        if last_of_its_margin and score > best_score:
            best_score, threshold = score, answer.margin
    return threshold


# -- the official metric ---------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation removed, articles removed, whitespace collapsed (the official rules)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold_texts: Sequence[str]) -> float:
    return max(float(normalize_answer(prediction) == normalize_answer(gold)) for gold in gold_texts)


def _token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)  # "no answer" scores 1 only against "no answer"
    same = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, gold_texts: Sequence[str]) -> float:
    return max(_token_f1(prediction, gold) for gold in gold_texts)


def squad_metrics(predicted: dict[str, str], examples: Sequence[QAExample]) -> dict[str, float]:
    """Exact match and F1 (fractions, 0-1) over all questions and over the answerable (has_answer) and
    unanswerable (no_answer) ones; every question needs a prediction."""
    missing = [e.id for e in examples if e.id not in predicted]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} question(s), e.g. {missing[0]}")
    groups = {"": list(examples), "has_answer_": [e for e in examples if e.is_impossible is False],
              "no_answer_": [e for e in examples if e.is_impossible]}
    metrics = {}
    for prefix, group in groups.items():
        if group:
            metrics[f"{prefix}em"] = float(np.mean([exact_match(predicted[e.id], e.gold_texts) for e in group]))
            metrics[f"{prefix}f1"] = float(np.mean([f1_score(predicted[e.id], e.gold_texts) for e in group]))
    return metrics


def qa_metrics(answers: dict[str, Answer], examples: Sequence[QAExample], threshold: float) -> dict[str, float]:
    """A run's qa_* metrics of labelled questions: at the threshold its predictions use (qa_em, qa_f1 and
    their has_answer / no_answer parts), the threshold, and at tau = 0 (qa_em_at_0, qa_f1_at_0)."""
    at_threshold = squad_metrics(predictions(answers, threshold), examples)
    at_zero = squad_metrics(predictions(answers, 0.0), examples)
    return {**{f"qa_{name}": value for name, value in at_threshold.items()}, "qa_threshold": threshold,
            "qa_em_at_0": at_zero["em"], "qa_f1_at_0": at_zero["f1"]}
