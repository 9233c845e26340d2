"""Load, validate and batch the course's tab-separated task files (SST, CFIMDB, Quora, STS).

File format, as the course ships it (read here with the csv module, delimiter tab, standard
double-quote quoting, as the course's csv.DictReader reads them, with one record per line: a stray
quote that would make the csv module swallow the following rows is an error naming its line):

    train/dev:      <index>  id  sentence  sentiment                (ids-sst-*, ids-cfimdb-*)
                    <index>  id  sentence1  sentence2  is_duplicate  (quora-*) or ... similarity (sts-*)
    test-student:   the same without the label column; the SST and CFIMDB ones carry two
                    leading index columns (header "0<TAB><TAB>id<TAB>sentence").

The first column(s) are unnamed pandas indexes and are ignored; only named columns are used.
Labels are written "3" (SST/CFIMDB) or "0.0"/"4.6" (Quora/STS). Text is kept as written apart
from stripping surrounding whitespace: the uncased tokenizer does the lowercasing.

Every problem with a file is a DataError "<path>:<line>: <problem>" raised at load time. Two
kinds of row are dropped, never silently (a DataWarning gives the count, the file and the lines):
rows whose label cell is empty in a labelled split (the course's quora-dev.csv has two,
which the course's loader also skipped), and training rows with an empty sentence. Dev and test
rows with an empty sentence are kept, because every id there must get a prediction.

Evaluation loaders (shuffle=False) visit examples longest first rather than in file order, to
pad less; every batch carries the examples' `ids`, so predictions are matched back by id.

A split is tokenised once (TokenizedExamples: truncated, unpadded token ids per example) and its batches
only pad; a TokenizationCache keeps each split's tokens for a whole run, so stages, epochs and evaluations
reuse them instead of tokenising every batch again.
"""
from __future__ import annotations

import csv
import io
import itertools
import math
import random
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from distributed import SINGLE_PROCESS, Distributed, cut_global_batches, global_batch_count, shard_batch
from files import DataError, DataWarning, show_data_warnings_on_one_line  # noqa: F401 (the loaders' errors)
from runtime import bucket_length
from squad import QAExample, QAWindows, load_squad
from tasks import PAIR_TASKS, SPLITS, TASKS, class_range, course_file_name

SENTENCE_TASKS = tuple(name for name, task in TASKS.items() if not (task.is_pair or task.is_extractive))  # sst, cfimdb
_WORD_OR_PUNCTUATION = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class SentenceExample:
    id: str
    sentence: str
    label: int | None


@dataclass(frozen=True)
class PairExample:
    id: str
    sentence1: str
    sentence2: str
    label: float | None


def standard_paths(data_dir: str | Path) -> dict[tuple[str, str], Path]:
    """(task, split) -> the course's file name inside data_dir, e.g. ("qqp", "test") -> quora-test-student.csv."""
    data_dir = Path(data_dir)
    return {(task, split): data_dir / course_file_name(task, split) for task in TASKS for split in SPLITS}


def load_sentence_examples(path: str | Path, task: str, split: str) -> list[SentenceExample]:
    """Read an SST or CFIMDB file; labels are ints (SST 0-4, CFIMDB 0/1), None for split="test"."""
    if task not in SENTENCE_TASKS:
        raise ValueError(f"task must be one of {SENTENCE_TASKS}, got {task!r}")
    return [SentenceExample(example_id, sentence, None if label is None else int(label))
            for example_id, (sentence,), label in _load_rows(path, task, split)]


def load_pair_examples(path: str | Path, task: str, split: str) -> list[PairExample]:
    """Read a QQP (quora-*.csv) or STS file; labels are floats (QQP 0.0/1.0, STS 0-5), None for split="test"."""
    if task not in PAIR_TASKS:
        raise ValueError(f"task must be one of {PAIR_TASKS}, got {task!r}")
    return [PairExample(example_id, sentence1, sentence2, label)
            for example_id, (sentence1, sentence2), label in _load_rows(path, task, split)]


def load_examples(path: str | Path, task: str,
                  split: str) -> list[SentenceExample] | list[PairExample] | list[QAExample]:
    """Read a data file of any task: sentences for sst / cfimdb, pairs for qqp / sts, SQuAD questions for qa."""
    if TASKS[task].is_extractive:
        return load_squad(path, split)
    if task in SENTENCE_TASKS:
        return load_sentence_examples(path, task, split)
    return load_pair_examples(path, task, split)


def load_split(data_dir: str | Path, task: str, split: str) -> list[SentenceExample] | list[PairExample]:
    """Load the course file for (task, split) from data_dir."""
    return load_examples(standard_paths(data_dir)[(task, split)], task, split)


@dataclass
class TaskData:
    """One task's examples: train (None when the run does not train the task), dev and test (None: SQuAD
    without a test file, as the official download has none)."""
    train: list | None
    dev: list
    test: list | None


def load_task_data(paths: dict[tuple[str, str], Path], tasks: Sequence[str], train_tasks: set[str],
                   max_train_examples: int | None = None, seed: int = 0,
                   without_test: set[str] = frozenset()) -> dict[str, TaskData]:
    """Every file the run needs, validated before any model is loaded: dev and test of each task in
    `tasks` (no test for those in `without_test`), train of those in `train_tasks` (subsampled to
    max_train_examples with `seed`)."""
    data = {}
    for task in tasks:
        train = None
        if task in train_tasks:
            train = subsample(load_examples(paths[(task, "train")], task, "train"), max_train_examples, seed)
        test = None if task in without_test else load_examples(paths[(task, "test")], task, "test")
        data[task] = TaskData(train, load_examples(paths[(task, "dev")], task, "dev"), test)
    return data


def _load_rows(path: str | Path, task: str, split: str) -> list[tuple[str, tuple[str, ...], float | None]]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    labelled = split != "test"
    label_column = TASKS[task].label_column
    text_columns = TASKS[task].text_columns
    required = ("id",) + text_columns + ((label_column,) if labelled else ())
    header, rows = _read_table(path, required)
    column = {name: i for i, name in enumerate(header)}  # a repeated name keeps its last position, as in DictReader

    loaded = []
    first_line_of_id: dict[str, int] = {}
    unlabelled_lines, empty_text_lines = [], []
    for line, fields in rows:
        example_id = fields[column["id"]].strip()
        if not example_id:
            raise DataError(path, "empty id", line)
        if example_id in first_line_of_id:
            raise DataError(path, f"duplicate id {example_id!r} (first on line {first_line_of_id[example_id]})", line)
        first_line_of_id[example_id] = line

        texts = tuple(fields[column[name]].strip() for name in text_columns)
        label = None
        if labelled:
            label_text = fields[column[label_column]].strip()
            if not label_text:
                unlabelled_lines.append(line)
                continue
            label = _parse_label(task, label_text, path, line)
        if split == "train" and not all(texts):
            empty_text_lines.append(line)
            continue
        loaded.append((example_id, texts, label))

    _warn_dropped(path, unlabelled_lines, f"an empty '{label_column}' label")
    _warn_dropped(path, empty_text_lines, "an empty sentence")
    if not loaded:
        raise DataError(path, "no usable rows: every row was dropped (see the warnings)")
    return loaded


def _read_table(path: str | Path, required_columns: Sequence[str]) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and (first line number, fields) of every record; blank lines are not records."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "file not found" if not path.exists() else "not a regular file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataError(path, f"text is not valid UTF-8 (byte 0x{raw[err.start]:02x})", line) from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise DataError(path, "file is empty")

    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t")
    header: list[str] | None = None
    header_line = 1
    rows = []
    last_line_read = 0
    try:
        for fields in reader:
            first_line, last_line_read = last_line_read + 1, reader.line_num
            if not fields:
                continue
            if header is None:
                header, header_line = fields, first_line
                continue
            if len(fields) != len(header):
                raise DataError(path, f"expected {len(header)} tab-separated fields as in the header, found "
                                      f"{len(fields)} (a stray tab or an unbalanced quote?)", first_line)
            if last_line_read > first_line:
                # The course's files hold one record per line; a record over several lines is a double
                # quote opening a field that the csv module then runs on to the next quote, rows and all.
                raise DataError(path, f"a double quote opens a field that runs on to line {last_line_read}; the "
                                      "course's files hold one record per line (a stray quote? double it as \"\" "
                                      "inside a quoted field)", first_line)
            rows.append((first_line, fields))
    except csv.Error as err:
        raise DataError(path, f"malformed CSV ({err})", last_line_read + 1) from None

    for name in required_columns:
        if name not in header:
            found = ", ".join(repr(h) for h in header)
            raise DataError(path, f"missing required column {name!r} (header has {found})", header_line)
    if not rows:
        raise DataError(path, "header but no data rows")
    return header, rows


def _parse_label(task: str, text: str, path: str | Path, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(path, f"label {text!r} is not a number", line) from None
    classes = TASKS[task].num_classes
    if classes is not None:
        valid, expected = value in range(classes), class_range(task)
    else:
        valid, expected = 0.0 <= value <= 5.0, "a number in [0, 5]"  # NaN fails both comparisons
    if not valid:
        raise DataError(path, f"{task} label {text!r} out of range (expected {expected})", line)
    return value


def _warn_dropped(path: str | Path, lines: list[int], reason: str) -> None:
    if not lines:
        return
    shown = ", ".join(str(n) for n in lines[:10]) + (", ..." if len(lines) > 10 else "")
    warnings.warn(f"{path}: dropped {len(lines)} row(s) with {reason} (lines {shown})", DataWarning, stacklevel=4)


def collate_sentences(examples: Sequence[SentenceExample], tokenizer, max_length: int) -> dict:
    """Tokenize a batch, padded to its longest sentence; labels is None for unlabelled examples.
    (Loaders tokenise a whole split once instead, TokenizedExamples, and give the same batches.)"""
    encoding = tokenizer([e.sentence for e in examples], padding=True, truncation=True,
                         max_length=max_length, return_tensors="pt")
    return {
        "input_ids": encoding["input_ids"],  # (B, T)
        "attention_mask": encoding["attention_mask"],  # (B, T)
        "token_type_ids": encoding["token_type_ids"],  # (B, T)
        "lengths": row_lengths(encoding["attention_mask"]),  # (B,) on the host
        "labels": _labels(examples, torch.long),  # (B,) or None
        "ids": [e.id for e in examples],
    }


def collate_pairs(examples: Sequence[PairExample], tokenizer, max_length: int,
                  label_dtype: torch.dtype = torch.float32, cross_encoder: bool = False) -> dict:
    """Tokenize a batch of pairs: each side on its own (SBERT, keys *_1 / *_2) or jointly.

    cross_encoder=True gives input_ids / attention_mask / token_type_ids of
    [CLS] s1 [SEP] s2 [SEP] with segment ids 0 then 1, truncated longest-first to max_length.
    """
    first = [e.sentence1 for e in examples]
    second = [e.sentence2 for e in examples]
    batch = {}
    if cross_encoder:
        encoding = tokenizer(first, text_pair=second, padding=True, truncation=True,
                             max_length=max_length, return_tensors="pt")
        batch["input_ids"] = encoding["input_ids"]  # (B, T)
        batch["attention_mask"] = encoding["attention_mask"]  # (B, T)
        batch["token_type_ids"] = encoding["token_type_ids"]  # (B, T)
        batch["lengths"] = row_lengths(encoding["attention_mask"])  # (B,) on the host
    else:
        for suffix, texts in (("_1", first), ("_2", second)):
            encoding = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            batch["input_ids" + suffix] = encoding["input_ids"]  # (B, T_side)
            batch["attention_mask" + suffix] = encoding["attention_mask"]  # (B, T_side)
            batch["token_type_ids" + suffix] = encoding["token_type_ids"]  # (B, T_side)
            batch["lengths" + suffix] = row_lengths(encoding["attention_mask"])  # (B,) on the host
    batch["labels"] = _labels(examples, label_dtype)  # (B,) or None
    batch["ids"] = [e.id for e in examples]
    return batch


def row_lengths(attention_mask: torch.Tensor) -> np.ndarray:
    """Each row's real tokens on the host, read from a right-padded mask (a collate's, on the CPU): the `lengths`
    that MultitaskBERT builds the encoder's layout from without reading the mask back from the device."""
    return attention_mask.cpu().numpy().sum(axis=1)


def _labels(examples: Sequence[SentenceExample] | Sequence[PairExample], dtype: torch.dtype) -> torch.Tensor | None:
    labels = [e.label for e in examples]
    if all(label is None for label in labels):
        return None
    if any(label is None for label in labels):
        raise ValueError("a batch mixes labelled and unlabelled examples")
    return torch.tensor(labels, dtype=dtype)


def estimate_length(text: str) -> int:
    """Words plus punctuation marks: a cheap stand-in for the WordPiece count, used only to sort."""
    return len(_WORD_OR_PUNCTUATION.findall(text))


def example_lengths(examples: Sequence[SentenceExample] | Sequence[PairExample],
                    cross_encoder: bool = False) -> list[int]:
    """Length estimates for bucketing: a pair counts the sum of both sides when encoded
    jointly, else the longer side (each side is padded separately)."""
    lengths = []
    for example in examples:
        if isinstance(example, SentenceExample):
            lengths.append(estimate_length(example.sentence))
        else:
            first, second = estimate_length(example.sentence1), estimate_length(example.sentence2)
            lengths.append(first + second if cross_encoder else max(first, second))
    return lengths


@dataclass(frozen=True, eq=False)
class _TokenRuns:
    """The encodings of one side of every example, back to back and unpadded: example i's tokens are
    input_ids[starts[i]:starts[i] + lengths[i]]. A subset shares the flat arrays and picks starts / lengths."""
    input_ids: np.ndarray  # (total tokens,) int32
    token_type_ids: np.ndarray  # (total tokens,) int8
    starts: np.ndarray  # (N,) int64
    lengths: np.ndarray  # (N,) int64

    @classmethod
    def from_encoding(cls, encoding: dict) -> "_TokenRuns":
        """From an unpadded tokenizer output: lists of ids and of token type ids per example."""
        lengths = np.fromiter(map(len, encoding["input_ids"]), dtype=np.int64, count=len(encoding["input_ids"]))
        total = int(lengths.sum())
        return cls(np.fromiter(itertools.chain.from_iterable(encoding["input_ids"]), dtype=np.int32, count=total),
                   np.fromiter(itertools.chain.from_iterable(encoding["token_type_ids"]), dtype=np.int8, count=total),
                   np.cumsum(lengths) - lengths, lengths)

    def subset(self, indices: np.ndarray) -> "_TokenRuns":
        return _TokenRuns(self.input_ids, self.token_type_ids, self.starts[indices], self.lengths[indices])

    def padded(self, rows: np.ndarray, pad_token_id: int, pad_to_multiple_of: int | None = None,
               max_length: int | None = None) -> dict:
        """input_ids / attention_mask / token_type_ids of `rows`, right-padded to the longest as the
        tokenizer pads (padding=True): [PAD] ids, attention 0 and token type 0 on the padding; with
        `pad_to_multiple_of`, to that length's bucket (bucket_length). `lengths`: each row's real tokens, a
        host-side array (MultitaskBERT builds the encoder's layout from it without reading the mask back)."""
        lengths = self.lengths[rows]  # (B,)
        offsets = np.arange(bucket_length(int(lengths.max()), pad_to_multiple_of, max_length))  # (T,)
        real = offsets < lengths[:, None]  # (B, T); an unpadded encoding attends to all its tokens
        positions = np.where(real, self.starts[rows, None] + offsets, 0)  # (B, T) into the flat arrays
        input_ids = np.where(real, self.input_ids[positions], pad_token_id)  # (B, T)
        token_type_ids = np.where(real, self.token_type_ids[positions], 0)  # (B, T)
        return {"input_ids": torch.from_numpy(input_ids.astype(np.int64)),
                "attention_mask": torch.from_numpy(real.astype(np.int64)),
                "token_type_ids": torch.from_numpy(token_type_ids.astype(np.int64)),
                "lengths": lengths.copy()}


class TokenizedExamples(Sequence):
    """Examples tokenised once, truncated to max_length but unpadded; collate(indices) pads a batch of them.

    Its batches equal collate_sentences' / collate_pairs' (pair labels float32) on the same examples,
    tensor for tensor: a sentence is encoded on its own, an SBERT pair side by side (keys *_1 / *_2), a
    cross-encoded pair as [CLS] s1 [SEP] s2 [SEP] truncated longest-first. Truncation acts on each
    example alone and padding only appends, so tokenising a split once and padding per batch gives
    what tokenising every batch gave.

    As a sequence it is its examples (len, iteration, tokenized[i] is an example), except that a slice
    is a TokenizedExamples again, so that predict_in_file_order can shard it.
    """

    def __init__(self, examples: list, sides: dict[str, _TokenRuns], lengths: list[int], max_length: int,
                 cross_encoder: bool, pad_token_id: int, label_dtype: torch.dtype):
        """The parts; TokenizedExamples.tokenize(examples, tokenizer, ...) makes them."""
        self.examples = examples
        self.sides = sides  # key suffix ("" or "_1" / "_2") -> that side's tokens
        self.lengths = lengths  # estimate_length's, for the length-bucketing sampler
        self.max_length, self.cross_encoder = max_length, cross_encoder
        self.pad_token_id = pad_token_id
        self.label_dtype = label_dtype

    @classmethod
    def tokenize(cls, examples: Sequence[SentenceExample] | Sequence[PairExample], tokenizer, max_length: int = 128,
                 cross_encoder: bool = False) -> "TokenizedExamples":
        """Every example through the tokenizer once: one call per side (two for SBERT pairs)."""
        if not examples:
            raise ValueError("no examples to batch")
        examples = list(examples)
        is_pair = isinstance(examples[0], PairExample)
        if cross_encoder and not is_pair:
            raise ValueError("cross_encoder applies to sentence pairs, not single sentences")

        def encode(texts: list[str], text_pair: list[str] | None = None) -> _TokenRuns:
            return _TokenRuns.from_encoding(tokenizer(texts, text_pair=text_pair, truncation=True,
                                                      max_length=max_length))
        if not is_pair:
            sides = {"": encode([e.sentence for e in examples])}
        elif cross_encoder:
            sides = {"": encode([e.sentence1 for e in examples], [e.sentence2 for e in examples])}
        else:
            sides = {"_1": encode([e.sentence1 for e in examples]), "_2": encode([e.sentence2 for e in examples])}
        return cls(examples, sides, example_lengths(examples, cross_encoder), max_length, cross_encoder,
                   tokenizer.pad_token_id, torch.float32 if is_pair else torch.long)

    def subset(self, indices: Sequence[int]) -> "TokenizedExamples":
        """These examples at `indices`, in that order, without tokenising again."""
        rows = np.asarray(indices, dtype=np.int64)
        kept = rows.tolist()
        return TokenizedExamples([self.examples[i] for i in kept],
                                 {suffix: runs.subset(rows) for suffix, runs in self.sides.items()},
                                 [self.lengths[i] for i in kept], self.max_length, self.cross_encoder,
                                 self.pad_token_id, self.label_dtype)

    def collate(self, indices: Sequence[int], pad_to_multiple_of: int | None = None) -> dict:
        """The batch of the examples at `indices`: padded tensors (to a bucket of `pad_to_multiple_of` tokens
        if given), each side's real-token `lengths` (on the host), labels (None when unlabelled) and ids."""
        rows = np.asarray(indices, dtype=np.int64)
        batch = {}
        for suffix, runs in self.sides.items():
            for key, tensor in runs.padded(rows, self.pad_token_id, pad_to_multiple_of, self.max_length).items():
                batch[key + suffix] = tensor  # (B, T) or (B, T_side)
        examples = [self.examples[i] for i in rows.tolist()]
        batch["labels"] = _labels(examples, self.label_dtype)  # (B,) or None
        batch["ids"] = [e.id for e in examples]
        return batch

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.subset(range(len(self))[index])
        return self.examples[index]

    def __iter__(self) -> Iterator:
        return iter(self.examples)


class TokenizationCache:
    """Each split tokenised once per (examples, max_length, cross_encoder) and kept for the run, so that
    later stages, epochs and evaluations batch it without calling the tokenizer again. Keyed by the
    examples' content (frozen dataclasses), so a copy of a split (subsample(split, None, seed)) finds it too."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._tokenized: dict[tuple, TokenizedExamples | QAWindows] = {}

    def get(self, examples: Sequence[SentenceExample] | Sequence[PairExample], max_length: int,
            cross_encoder: bool = False) -> TokenizedExamples:
        key = (tuple(examples), max_length, cross_encoder)
        tokenized = self._tokenized.get(key)
        if tokenized is None:
            tokenized = self._tokenized[key] = TokenizedExamples.tokenize(examples, self.tokenizer, max_length,
                                                                          cross_encoder)
        return tokenized

    def windows(self, examples: Sequence[QAExample], max_length: int, doc_stride: int) -> QAWindows:
        """SQuAD questions cut into their windows (squad.QAWindows), once per run."""
        key = ("windows", tuple(examples), max_length, doc_stride)
        windows = self._tokenized.get(key)
        if windows is None:
            windows = self._tokenized[key] = QAWindows.build(examples, self.tokenizer, max_length, doc_stride)
        return windows


class LengthBucketSampler(Sampler[list[int]]):
    """Batch sampler that groups examples of similar length, so batches need little padding.

    shuffle=True: shuffle all indices, cut them into buckets of batch_size * bucket_size_multiplier,
    sort each bucket by length, cut it into batches and shuffle the batches. The order depends only
    on (seed, epoch); call set_epoch(epoch) before each epoch to get a new one, set_epoch(epoch, start) to
    begin that epoch after its first `start` batches (a resumed run: those are never collated).
    shuffle=False: indices sorted by length, longest first, so an out-of-memory error shows up on
    the first batch rather than the last.
    Every index appears in exactly one batch per pass; only the last batch of a bucket can be short.
    Under torchrun (world_size > 1, shuffle=True) the batches are global ones of batch_size *
    world_size and each rank yields its slice of them (distributed.shard_batch): every rank draws the
    same order from the seed, so the ranks together see each index once.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, shuffle: bool, seed: int = 0,
                 bucket_size_multiplier: int = 50, world_size: int = 1, rank: int = 0):
        if batch_size < 1 or bucket_size_multiplier < 1:
            raise ValueError("batch_size and bucket_size_multiplier must be at least 1")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.world_size, self.rank = world_size, rank
        self.bucket_size = batch_size * world_size * bucket_size_multiplier
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        if not self.shuffle:
            return math.ceil(len(self.lengths) / self.batch_size)
        return global_batch_count(len(self.lengths), self.batch_size, self.world_size)

    def __iter__(self):
        if not self.shuffle:
            order = sorted(range(len(self.lengths)), key=lambda i: -self.lengths[i])
            yield from cut_global_batches(order, self.batch_size, 1)[self.start:]
            return
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths)).tolist()
        batches = []
        starts = list(range(0, len(order), self.bucket_size))
        if len(starts) > 1 and len(order) - starts[-1] < self.world_size:
            starts.pop()  # a last bucket too small to give every rank an example joins the one before
        for start, end in zip(starts, [*starts[1:], len(order)]):
            bucket = sorted(order[start:end], key=self.lengths.__getitem__)
            batches.extend(cut_global_batches(bucket, self.batch_size, self.world_size))
        for i in rng.permutation(len(batches)).tolist()[self.start:]:
            yield shard_batch(batches[i], self.world_size, self.rank)


def make_dataloader(examples: Sequence[SentenceExample] | Sequence[PairExample], tokenizer, batch_size: int,
                    shuffle: bool, seed: int = 0, max_length: int = 128, cross_encoder: bool = False,
                    num_workers: int = 0, world_size: int = 1, rank: int = 0, pin_memory: bool = False) -> DataLoader:
    """DataLoader over length-bucketed batches of `examples`, tokenised once here (tokenized_dataloader).

    Batches are the dicts of collate_sentences / collate_pairs (pair labels are float32). With
    shuffle=True call loader.batch_sampler.set_epoch(epoch) each epoch for a fresh order. With
    shuffle=False the order is longest first, not file order: match predictions by batch["ids"].
    """
    return tokenized_dataloader(TokenizedExamples.tokenize(examples, tokenizer, max_length, cross_encoder),
                                batch_size, shuffle, seed, num_workers, world_size, rank, pin_memory)


def tokenized_dataloader(tokenized: TokenizedExamples, batch_size: int, shuffle: bool, seed: int = 0,
                         num_workers: int = 0, world_size: int = 1, rank: int = 0,
                         pin_memory: bool = False, pad_to_multiple_of: int | None = None) -> DataLoader:
    """make_dataloader over examples tokenised already (or SQuAD's QAWindows): its batches only pad.

    pin_memory=True (for CUDA) puts every batch in page-locked memory, so that runtime.to_device's
    non_blocking copy to the GPU is asynchronous. pad_to_multiple_of (CUDA: runtime.PAD_TO_MULTIPLE_OF) pads every
    batch to a bucket length, so that batch shapes repeat (bucket_length)."""
    if not len(tokenized):
        raise ValueError("no examples to batch")
    sampler = LengthBucketSampler(tokenized.lengths, batch_size, shuffle, seed, world_size=world_size, rank=rank)
    # The loader's items are example indices; the collate pads the examples' tokens into a batch.
    collate = tokenized.collate if pad_to_multiple_of is None else partial(tokenized.collate,
                                                                            pad_to_multiple_of=pad_to_multiple_of)
    return DataLoader(range(len(tokenized)), batch_sampler=sampler, collate_fn=collate,
                      num_workers=num_workers, pin_memory=pin_memory)



def in_file_order(examples: Sequence, batch_ids: Sequence[str], values) -> tuple[list[str], np.ndarray]:
    """Per-example values gathered batch by batch (eval batches are length-sorted) back in the examples'
    order: (ids, values)."""
    by_id = dict(zip(batch_ids, values))
    ids = [e.id for e in examples]
    return ids, np.array([by_id[i] for i in ids])


def predict_in_file_order(examples: Sequence, predict_shard, distributed: Distributed = SINGLE_PROCESS
                          ) -> tuple[list[str], np.ndarray]:
    """(ids, values) of every example in the examples' order. predict_shard(examples) -> (batch ids, values
    array) runs on this rank's every world_size-th example; under torchrun all ranks get every value."""
    shard = examples[distributed.rank::distributed.world_size]
    parts = distributed.gather_objects(predict_shard(shard) if shard else None)
    parts = [part for part in parts if part is not None]  # a rank with no example sends None
    return in_file_order(examples, [i for ids, _ in parts for i in ids], np.concatenate([v for _, v in parts]))


def subsample(examples: Sequence, n: int | None, seed: int) -> list:
    """A deterministic random subset of n examples in their original order (all of them if n is None or too large)."""
    return [examples[i] for i in subsample_indices(len(examples), n, seed)]


def subsample_indices(count: int, n: int | None, seed: int) -> list[int]:
    """The indices, ascending, of the n of `count` examples that subsample(examples, n, seed) keeps."""
    if n is None or n >= count:
        return list(range(count))
    if n < 1:
        raise ValueError(f"cannot keep {n} examples; use at least 1")
    return sorted(random.Random(seed).sample(range(count), n))
