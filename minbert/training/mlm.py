"""In-domain masked-language-model training: a stage `mlm` that continues BERT's pretraining objective on
the task *training* sentences (never dev or test text), as the handout suggests (§ "further pre-train on
target-domain data") and the best public code for the course did.

Masking is BERT's: 15% of the real tokens ([CLS], [SEP] and padding never), of which 80% become [MASK],
10% a random token and 10% stay; the loss is the cross entropy at the chosen positions only. The head is
BERT's: dense -> GELU -> LayerNorm, then a decoder tied to the word embeddings plus a bias per token.
A checkpoint's own `cls.predictions.*` head is loaded when it has one; otherwise it starts fresh.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from base_bert import BertConfig, CheckpointError, find_weight_file, load_state_dict_file, resolve_pretrained
from bert import host_indices
from minbert.data.batches import PairExample, TaskData, row_lengths
from minbert.distributed import cut_global_batches, shard_batch
from minbert.tasks import MULTITASK

IGNORED_LABEL = -100
MASK_PROBABILITY = 0.15
# A Hugging Face BertForPreTraining / BertForMaskedLM head, by our names (old checkpoints say gamma/beta).
HF_MLM_HEAD = {"cls.predictions.transform.dense.weight": "transform.weight",
               "cls.predictions.transform.dense.bias": "transform.bias",
               "cls.predictions.transform.LayerNorm.weight": "norm.weight",
               "cls.predictions.transform.LayerNorm.gamma": "norm.weight",
               "cls.predictions.transform.LayerNorm.bias": "norm.bias",
               "cls.predictions.transform.LayerNorm.beta": "norm.bias",
               "cls.predictions.bias": "bias"}


class MaskedLanguageModelHead(nn.Module):
    """BERT's MLM head; the decoder is the word-embedding matrix, passed in at call time (tied weights)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        nn.init.normal_(self.transform.weight, std=config.initializer_range)
        nn.init.zeros_(self.transform.bias)

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(F.gelu(self.transform(hidden))), word_embeddings, self.bias)  # (M, V)


def load_mlm_head(pretrained: str, config: BertConfig) -> tuple[MaskedLanguageModelHead, bool]:
    """The pretrained checkpoint's MLM head, or a fresh one; the flag says whether it was found."""
    head = MaskedLanguageModelHead(config)
    state = load_state_dict_file(find_weight_file(resolve_pretrained(pretrained)), keys=tuple(HF_MLM_HEAD))
    found = {ours: state[key] for key, ours in HF_MLM_HEAD.items() if key in state}
    if not found:
        return head, False
    try:
        head.load_state_dict(found)
    except RuntimeError as err:
        raise CheckpointError(f"{pretrained}: its MLM head does not fit the model ({err})") from None
    return head, True


def task_sentences(data: dict[str, TaskData]) -> list[str]:
    """Every distinct sentence of the three tasks' train sets among `data`, in file order (dev and test never)."""
    sentences: dict[str, None] = {}
    for task in (task for task in MULTITASK if task in data):
        for example in data[task].train or ():
            texts = (example.sentence1, example.sentence2) if isinstance(example, PairExample) else (example.sentence,)
            sentences.update(dict.fromkeys(texts))
    return list(sentences)


def mask_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, special: torch.Tensor, mask_token_id: int,
                vocab_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking of a (B, T) batch: (inputs, labels), labels IGNORED_LABEL where nothing is predicted.
    `special` (B, T) is True at [CLS] / [SEP]; padding is excluded through the attention mask."""
    candidates = attention_mask.bool() & ~special
    chosen = (torch.rand(input_ids.shape, generator=generator) < MASK_PROBABILITY) & candidates
    labels = input_ids.masked_fill(~chosen, IGNORED_LABEL)
    draw = torch.rand(input_ids.shape, generator=generator)
    random_tokens = torch.randint(vocab_size, input_ids.shape, generator=generator)
    inputs = torch.where(chosen & (draw < 0.8), mask_token_id, input_ids)
    inputs = torch.where(chosen & (draw >= 0.8) & (draw < 0.9), random_tokens, inputs)
    return inputs, labels


def mlm_batches(sentences: list[str], tokenizer, batch_size: int, seed: int, max_length: int,
                world_size: int = 1, rank: int = 0, start: int = 0) -> Iterator[dict]:
    """Masked batches of the sentences in a seeded random order: input_ids, attention_mask, labels (B, T).
    Under torchrun, this rank's slice of each global batch, masked by its own generator. `start`: the batches
    to leave out at the beginning (a resumed stage's); they are still masked, as the generator's draws for the
    later batches follow theirs."""
    if tokenizer.mask_token_id is None:
        raise CheckpointError("the vocabulary has no [MASK] token, which the mlm stage needs")
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    generator = torch.Generator().manual_seed(seed + rank)
    for index, indices in enumerate(cut_global_batches(order, batch_size, world_size)):
        encoding = tokenizer([sentences[i] for i in shard_batch(indices, world_size, rank)], padding=True,
                             truncation=True, max_length=max_length, return_tensors="pt")
        ids = encoding["input_ids"]
        special = (ids == tokenizer.cls_token_id) | (ids == tokenizer.sep_token_id)
        inputs, labels = mask_tokens(ids, encoding["attention_mask"], special, tokenizer.mask_token_id,
                                     tokenizer.vocab_size, generator)
        if index >= start:
            # On the host, for a step that reads nothing back: the rows' lengths (the encoder's layout) and the
            # masked positions, flat in (B, T) order (the decoder's).
            yield {"input_ids": inputs, "attention_mask": encoding["attention_mask"], "labels": labels,
                   "lengths": row_lengths(encoding["attention_mask"]),
                   "masked": np.flatnonzero(labels.numpy() != IGNORED_LABEL)}


def mlm_loss(bert, head: MaskedLanguageModelHead, batch: dict) -> torch.Tensor:
    """Cross entropy of the tokens at the masked positions (the decoder runs on those positions only). The batch's
    host-side `lengths` and `masked` positions (mlm_batches') spare the device any read back; without them they
    are found on the device."""
    mask = batch["attention_mask"]
    hidden = bert.encode(bert.embed(batch["input_ids"]), mask, bert.encoder.layout(mask, batch.get("lengths")))
    masked = batch.get("masked")
    if masked is None:
        masked = (batch["labels"] != IGNORED_LABEL).reshape(-1).nonzero().squeeze(1)  # (M,), a host sync
    elif len(masked):
        masked = host_indices(masked, hidden.device)  # (M,)
    if not len(masked):  # a batch of one-word sentences can draw no position: nothing to learn
        return hidden.sum() * 0.0
    tokens = hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked)  # (M, H)
    logits = head(tokens, bert.embeddings.word_embeddings.weight)  # (M, V)
    return F.cross_entropy(logits.float(), batch["labels"].reshape(-1).index_select(0, masked))


class MaskedLanguageModelObjective:
    """An mlm stage's objective, called as a task's (objective.TaskObjective): a batch's loss and its terms (none);
    `local_items`, what the loss is a mean over on this rank (the masked positions, mlm_batches' on the host)."""
    name = "mlm"

    def __init__(self, head: MaskedLanguageModelHead):
        self.head = head

    def __call__(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return mlm_loss(model.bert, self.head, batch), {}

    def local_items(self, batch: dict) -> int:
        return len(batch["masked"])
