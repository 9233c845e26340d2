"""mlm.py: BERT's masking, the tied MLM head and its loss, the training sentences it reads."""
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from conftest import tiny_bert
from minbert.data.batches import PairExample, SentenceExample, TaskData
from minbert.training.mlm import (IGNORED_LABEL, MaskedLanguageModelHead, load_mlm_head, mask_tokens, mlm_batches,
                                  mlm_loss, task_sentences)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_masking_follows_bert_15_percent_then_80_10_10_and_never_touches_special_or_padding():
    ids = torch.randint(1000, 30000, (400, 50))
    mask = torch.ones_like(ids)
    mask[:, 40:] = 0
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, 39] = True
    inputs, labels = mask_tokens(ids, mask, special, 103, 30522, torch.Generator().manual_seed(0))
    chosen = labels != IGNORED_LABEL
    assert not chosen[special].any() and not chosen[:, 40:].any()
    assert torch.equal(labels[chosen], ids[chosen])  # labels are the original tokens
    assert chosen.sum() / (mask.bool() & ~special).sum() == pytest.approx(0.15, abs=0.01)
    masked = (inputs == 103) & chosen
    kept = (inputs == ids) & chosen
    assert masked.sum() / chosen.sum() == pytest.approx(0.8, abs=0.02)
    assert kept.sum() / chosen.sum() == pytest.approx(0.1 + 0.1 / 30522, abs=0.02)  # a random token may be the same
    assert torch.equal(inputs[~chosen], ids[~chosen])


def test_mlm_loss_is_cross_entropy_at_masked_positions_with_the_decoder_tied_to_word_embeddings():
    bert = tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    head = MaskedLanguageModelHead(bert.config)
    ids = torch.randint(1000, 2000, (2, 6))
    labels = torch.full_like(ids, IGNORED_LABEL)
    labels[0, 2], labels[1, 4] = 1500, 1600
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    loss = mlm_loss(bert, head, batch)
    hidden = bert.encode(bert.embed(ids), batch["attention_mask"])
    transformed = head.norm(F.gelu(head.transform(hidden[[0, 1], [2, 4]])))
    logits = transformed @ bert.embeddings.word_embeddings.weight.T + head.bias
    torch.testing.assert_close(loss, F.cross_entropy(logits, torch.tensor([1500, 1600])))
    loss.backward()
    assert bert.embeddings.word_embeddings.weight.grad[1500].abs().sum() > 0  # the decoder is the embedding
    assert not [name for name, _ in head.named_parameters() if "word" in name]


def test_a_batch_without_masked_positions_gives_a_zero_loss_that_still_backpropagates():
    bert = tiny_bert()
    ids = torch.randint(1000, 2000, (2, 3))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.full_like(ids, IGNORED_LABEL)}
    loss = mlm_loss(bert, MaskedLanguageModelHead(bert.config), batch)
    assert loss.item() == 0.0
    loss.backward()


def test_training_sentences_are_distinct_and_never_from_dev_or_test():
    data = {"sst": TaskData([SentenceExample("1", "a film", 3), SentenceExample("2", "a film", 4)],
                            [SentenceExample("d", "dev text", 1)], []),
            "qqp": TaskData([PairExample("3", "why?", "a film", 1.0)], [], [PairExample("t", "test", "text", None)]),
            "sts": TaskData(None, [], [])}
    assert task_sentences(data) == ["a film", "why?"]


def test_mlm_batches_are_seeded_and_cover_every_sentence_once(tokenizer):
    sentences = [f"sentence number {i} about a film" for i in range(10)]
    first = list(mlm_batches(sentences, tokenizer, 4, seed=3, max_length=16))
    again = list(mlm_batches(sentences, tokenizer, 4, seed=3, max_length=16))
    assert [len(b["input_ids"]) for b in first] == [4, 4, 2]
    for a, b in zip(first, again):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    restored = [torch.where(b["labels"] == IGNORED_LABEL, b["input_ids"], b["labels"]) for b in first]
    texts = sorted(tokenizer.decode(row.tolist()) for batch in restored for row in batch)
    assert texts == sorted(sentences)


def test_a_checkpoint_without_an_mlm_head_starts_a_fresh_one_and_one_with_a_head_loads_it(tiny_checkpoint, tmp_path):
    bert = tiny_bert()
    head, found = load_mlm_head(str(tiny_checkpoint), bert.config)
    assert not found and torch.equal(head.bias, torch.zeros_like(head.bias))
    with_head = tmp_path / "with_head"
    shutil.copytree(tiny_checkpoint, with_head)
    state = load_file(str(with_head / "model.safetensors"))
    trained = MaskedLanguageModelHead(bert.config)
    torch.nn.init.normal_(trained.bias)
    state.update({"cls.predictions.transform.dense.weight": trained.transform.weight.detach(),
                  "cls.predictions.transform.dense.bias": trained.transform.bias.detach(),
                  "cls.predictions.transform.LayerNorm.weight": trained.norm.weight.detach(),
                  "cls.predictions.transform.LayerNorm.bias": trained.norm.bias.detach(),
                  "cls.predictions.bias": trained.bias.detach()})
    save_file({k: v.contiguous() for k, v in state.items()}, str(with_head / "model.safetensors"))
    loaded, found = load_mlm_head(str(with_head), bert.config)
    assert found and torch.equal(loaded.bias, trained.bias) and torch.equal(loaded.transform.weight,
                                                                            trained.transform.weight)
