"""Load the tasks' files (each task reads and validates its own: minbert/tasks/course_files.py for the course's
CSVs) and batch them.

Evaluation loaders (shuffle=False) visit examples longest first rather than in file order, to
pad less; every batch carries the examples' `ids`, so predictions are matched back by id.

A split is tokenised once (TokenizedExamples: truncated, unpadded token ids per example) and its batches
only pad; a TokenizationCache keeps each split's tokens for a whole run, so stages, epochs and evaluations
reuse them instead of tokenising every batch again.
"""
from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from minbert.distributed import SINGLE_PROCESS, Distributed, cut_global_batches, global_batch_count, shard_batch
from minbert.files import DataError, DataWarning, show_data_warnings_on_one_line  # noqa: F401 (the loaders' errors)
from minbert.runtime import bucket_length
from minbert.tasks import SPLITS, TASKS, course_file_name
from minbert.tasks.course_files import PairExample, SentenceExample
from minbert.tasks.squad import QAExample, QAWindows

SENTENCE_TASKS = tuple(name for name, task in TASKS.items() if len(task.text_columns) == 1)  # sst, cfimdb
_WORD_OR_PUNCTUATION = re.compile(r"\w+|[^\w\s]")


def standard_paths(data_dir: str | Path) -> dict[tuple[str, str], Path]:
    """(task, split) -> the course's file name inside data_dir, e.g. ("qqp", "test") -> quora-test-student.csv."""
    data_dir = Path(data_dir)
    return {(task, split): data_dir / course_file_name(task, split) for task in TASKS for split in SPLITS}


def load_sentence_examples(path: str | Path, task: str, split: str) -> list[SentenceExample]:
    """Read an SST or CFIMDB file; labels are ints (SST 0-4, CFIMDB 0/1), None for split="test"."""
    if task not in SENTENCE_TASKS:
        raise ValueError(f"task must be one of {SENTENCE_TASKS}, got {task!r}")
    return load_examples(path, task, split)


def load_examples(path: str | Path, task: str,
                  split: str) -> list[SentenceExample] | list[PairExample] | list[QAExample]:
    """Read a data file of any task: sentences for sst / cfimdb, pairs for qqp / sts, SQuAD questions for qa."""
    return TASKS[task].data.load(path, split)


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


class TokenizedSplits:
    """Each split ready to batch, made on its first use only and kept for the run (training and prediction share
    them): tokenised examples at the run's max_length and the task's pair encoding, or SQuAD's windows, as the
    tasks' own options (`task_settings`: tasks.task_settings) say. `model`: the run's
    MultitaskBERT, which says how it reads each task's pairs (reads_pairs_jointly)."""

    def __init__(self, tokenizer, model, max_length: int, task_settings: Mapping[str, object]):
        self.cache = TokenizationCache(tokenizer)
        self.model, self.max_length, self.task_settings = model, max_length, task_settings

    @property
    def tokenizer(self):
        return self.cache.tokenizer

    def get(self, task: str, examples: list) -> TokenizedExamples | QAWindows:
        joint_pairs = self.model.reads_pairs_jointly(task)
        return TASKS[task].data.tokenize(self.cache, examples, self.max_length, joint_pairs, self.task_settings)


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
