"""A split is tokenised once (datasets.TokenizedExamples) and its batches only pad: they must equal the batches
of tokenising every batch (collate_sentences / collate_pairs), tensor for tensor and in the same order, and the
trainer must not call the tokenizer again for later stages, epochs or evaluations."""
from functools import partial

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import MAX_LENGTH, demo_examples, deterministic_tiny_model
from minbert.data.batches import (LengthBucketSampler, PairExample, TaskData, TokenizationCache, TokenizedExamples,
                                  collate_pairs, collate_sentences, example_lengths, make_dataloader, subsample,
                                  subsample_indices, tokenized_dataloader)
from minbert.prediction.inference import predict_examples
from minbert.run.run_setup import build_trainer
from minbert.run.training_args import TrainingArguments
from minbert.training.schedules import Stage, StageKind

pytestmark = pytest.mark.usefixtures("one_thread")

# sentences, SBERT pairs (each side on its own), cross-encoded pairs ([CLS] a [SEP] b [SEP])
ENCODINGS = [("sst", False), ("sts", False), ("qqp", True)]


def tokenized_every_batch(examples, tokenizer, batch_size, shuffle, seed, max_length, cross_encoder) -> DataLoader:
    """The loader as it was: the same sampler, and a collate that calls the tokenizer on every batch."""
    if isinstance(examples[0], PairExample):
        collate = partial(collate_pairs, tokenizer=tokenizer, max_length=max_length, cross_encoder=cross_encoder)
    else:
        collate = partial(collate_sentences, tokenizer=tokenizer, max_length=max_length)
    sampler = LengthBucketSampler(example_lengths(examples, cross_encoder), batch_size, shuffle, seed)
    return DataLoader(examples, batch_sampler=sampler, collate_fn=collate)


def assert_same_batches(actual_loader, expected_loader, epochs: int = 2) -> None:
    for epoch in range(epochs):
        for loader in (actual_loader, expected_loader):
            loader.batch_sampler.set_epoch(epoch)
        actual, expected = list(actual_loader), list(expected_loader)
        assert len(actual) == len(expected)
        for got, want in zip(actual, expected):
            assert list(got) == list(want)  # the same keys in the same order
            for key, value in want.items():
                if torch.is_tensor(value):
                    assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
                elif isinstance(value, np.ndarray):
                    assert got[key].dtype == value.dtype and np.array_equal(got[key], value), key
                else:
                    assert got[key] == value, key


@pytest.mark.parametrize("task,cross_encoder", ENCODINGS)
@pytest.mark.parametrize("max_length", [10, 128])  # 10 truncates most examples (longest-first for pairs)
@pytest.mark.parametrize("shuffle", [True, False])
def test_tokenized_batches_equal_tokenising_every_batch(tokenizer, task, cross_encoder, max_length, shuffle):
    examples = demo_examples(task, "train", 60)
    expected = tokenized_every_batch(examples, tokenizer, 8, shuffle, 3, max_length, cross_encoder)
    actual = make_dataloader(examples, tokenizer, 8, shuffle, seed=3, max_length=max_length,
                             cross_encoder=cross_encoder)
    assert_same_batches(actual, expected)


@pytest.mark.parametrize("task,cross_encoder", ENCODINGS)
def test_unlabelled_test_batches_equal_tokenising_every_batch(tokenizer, task, cross_encoder):
    examples = demo_examples(task, "test", 30)
    expected = tokenized_every_batch(examples, tokenizer, 8, False, 0, 16, cross_encoder)
    actual = make_dataloader(examples, tokenizer, 8, shuffle=False, max_length=16, cross_encoder=cross_encoder)
    assert_same_batches(actual, expected, epochs=1)
    assert all(batch["labels"] is None for batch in actual)


def test_truncation_at_a_small_max_length_is_the_tokenizers(tokenizer):
    long = "a rather long sentence that goes on and on " * 4
    pairs = [PairExample("a", long, "short", 1.0), PairExample("b", "short", long, 0.0),
             PairExample("c", long, long, 1.0), PairExample("d", "", "", 0.0)]
    for cross_encoder in (False, True):
        batch = TokenizedExamples.tokenize(pairs, tokenizer, 12, cross_encoder).collate([0, 1, 2, 3])
        expected = collate_pairs(pairs, tokenizer, 12, cross_encoder=cross_encoder)
        for key, value in expected.items():
            if isinstance(value, np.ndarray):
                assert np.array_equal(batch[key], value), key
            else:
                assert torch.equal(batch[key], value) if torch.is_tensor(value) else batch[key] == value, key
        suffix = "" if cross_encoder else "_1"
        assert batch["input_ids" + suffix].shape[1] == 12


@pytest.mark.parametrize("task,cross_encoder", ENCODINGS)
def test_a_subset_batches_like_the_subsampled_examples(tokenizer, task, cross_encoder):
    examples = demo_examples(task, "train", 80)
    tokenized = TokenizedExamples.tokenize(examples, tokenizer, 32, cross_encoder)
    subset = tokenized.subset(subsample_indices(len(examples), 30, seed=7))
    assert list(subset) == subsample(examples, 30, seed=7)
    expected = tokenized_every_batch(subsample(examples, 30, seed=7), tokenizer, 4, True, 5, 32, cross_encoder)
    assert_same_batches(tokenized_dataloader(subset, 4, shuffle=True, seed=5), expected)


def test_a_slice_is_a_tokenized_shard(tokenizer):
    examples = demo_examples("sts", "dev", 9)
    tokenized = TokenizedExamples.tokenize(examples, tokenizer, 32)
    shard = tokenized[1::2]
    assert isinstance(shard, TokenizedExamples) and list(shard) == examples[1::2]
    assert tokenized[3] == examples[3] and len(tokenized) == 9
    assert torch.equal(shard.collate([0])["input_ids_2"], tokenized.collate([1])["input_ids_2"])


def test_the_cache_tokenises_each_split_once_and_finds_an_equal_copy(tokenizer):
    counting = CountingTokenizer(tokenizer)
    cache = TokenizationCache(counting)
    examples = demo_examples("sts", "dev", 12)
    first = cache.get(examples, 32)
    assert cache.get(list(examples), 32) is first and counting.calls == 2  # the two SBERT sides
    assert cache.get(examples, 32, cross_encoder=True) is not first and counting.calls == 3
    assert cache.get(examples, 16) is not first and counting.calls == 5


def test_make_dataloader_pins_memory_only_when_asked(tokenizer):
    examples = demo_examples("sst", "dev", 8)
    assert make_dataloader(examples, tokenizer, 4, shuffle=False).pin_memory is False
    assert make_dataloader(examples, tokenizer, 4, shuffle=False, pin_memory=True).pin_memory is True


class CountingTokenizer:
    """The tokenizer, counting its calls (each call encodes a list of texts)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_the_trainer_tokenises_each_split_once_across_stages_and_evaluations(tmp_path, tokenizer):
    counting = CountingTokenizer(tokenizer)
    data = {task: TaskData(demo_examples(task, "train", 16), demo_examples(task, "dev", 8),
                           demo_examples(task, "test", 4)) for task in ("sst", "qqp", "sts")}
    args = TrainingArguments(option="finetune", schedule="round_robin", batch_size=4, max_length=MAX_LENGTH,
                             quiet=True, output_dir=str(tmp_path / "run"))
    trainer = build_trainer(args, deterministic_tiny_model(), counting, data, [], torch.device("cpu"))
    stages = [Stage(StageKind.TASK, "sst"), Stage(StageKind.TASK, "qqp", fraction=0.5), Stage(StageKind.MULTITASK)]

    def one_round(first_index: int) -> None:
        for index, stage in enumerate(stages, first_index):
            trainer.run_stage(index, stage)
            trainer.evaluator.evaluate("dev")
        trainer.predictor.predict("sts", trainer.data["sts"].test)

    one_round(0)
    # train: sst 1, qqp 2 (SBERT: a call per side), sts 2; dev: 1 + 2 + 2; sts test 2
    assert counting.calls == 12
    one_round(len(stages))  # new stages (new orders and subsets) and evaluations: no new tokenisation
    assert counting.calls == 12


def test_predict_examples_takes_examples_tokenised_already(tokenizer):
    model = deterministic_tiny_model().eval()
    examples = demo_examples("sts", "dev", 10)
    device = torch.device("cpu")
    ids, scores = predict_examples(model, "sts", examples, tokenizer, device, 4, 32, scores=True)
    tokenized = TokenizedExamples.tokenize(examples, tokenizer, 32)
    same_ids, same_scores = predict_examples(model, "sts", tokenized, tokenizer, device, 4, 32, scores=True)
    assert same_ids == ids == [e.id for e in examples] and (same_scores == scores).all()
    with pytest.raises(ValueError, match="max_length"):
        predict_examples(model, "sts", tokenized, tokenizer, device, 4, 16)
