"""MultitaskBERT: one shared minBERT with Sentence-BERT heads for SST-5, QQP and STS-B.

    sst: dropout + linear on the pooled sentence -> 5 logits
    qqp: u, v pooled separately, dropout + linear on [u, v, |u - v|] -> 1 logit
    sts: cos(u, v)
With pair_encoder="cross" the pair tasks read one joint [CLS] s1 [SEP] s2 [SEP] encoding and a linear
head each instead. Losses and the decoding of outputs into predictions are in losses.py.

SMART perturbs the embedding output, so the forward pass also comes in three parts:

    inputs = model.encoder_inputs(task, batch)       # the (B, T) or, for SBERT pairs, (2B, T) encoder batch
    embeddings = model.embed(inputs)                 # a tuple holding one (B, T, H) or (2B, T, H)
    outputs = model.outputs_from_embeddings(task, embeddings, inputs.attention_mask)
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from base_bert import BertConfig, CheckpointError
from bert import BertModel
from checkpoint import atomic_save, check_fields, read_checkpoint
from losses import SIMILARITY_OBJECTIVES, task_objectives
from tasks import TASKS

POOLINGS = ("mean", "cls")
PAIR_ENCODERS = ("sbert", "cross")
N_SENTIMENT_CLASSES = TASKS["sst"].num_classes


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the non-padding token states."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, H)


def pad_to(ids: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(ids, (0, length - ids.shape[1]))  # pad id, mask and segment are all 0


class EncoderInputs(NamedTuple):
    input_ids: torch.Tensor  # (B, T) or (2B, T)
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None


class MultitaskBERT(nn.Module):
    """Shared minBERT with Sentence-BERT heads (see the module docstring)."""

    def __init__(self, bert: BertModel, pooling: str = "mean", dropout: float = 0.1,
                 pair_encoder: str = "sbert", similarity_objective: str = "cosine"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if pair_encoder not in PAIR_ENCODERS:
            raise ValueError(f"pair_encoder must be one of {PAIR_ENCODERS}, got {pair_encoder!r}")
        if similarity_objective not in SIMILARITY_OBJECTIVES:
            raise ValueError(f"similarity_objective must be one of {SIMILARITY_OBJECTIVES}, "
                             f"got {similarity_objective!r}")
        hidden = bert.config.hidden_size
        self.bert = bert
        self.pooling = pooling
        self.pair_encoder = pair_encoder
        self.similarity_objective = similarity_objective
        self.objectives = task_objectives(pair_encoder, similarity_objective)
        self.dropout = nn.Dropout(dropout)
        self.sentiment_head = nn.Linear(hidden, N_SENTIMENT_CLASSES)
        if pair_encoder == "sbert":
            self.paraphrase_head = nn.Linear(3 * hidden, 1)
        else:
            self.paraphrase_head = nn.Linear(hidden, 1)
            self.similarity_head = nn.Linear(hidden, 1)

    def head_options(self) -> dict:
        return {"pooling": self.pooling, "dropout": self.dropout.p, "pair_encoder": self.pair_encoder,
                "similarity_objective": self.similarity_objective}

    def reads_pairs_jointly(self, task: str) -> bool:
        """Whether this task's batches hold each pair as one sequence (collate with cross_encoder=True)."""
        return task != "sst" and self.pair_encoder == "cross"

    @staticmethod
    def is_shared(parameter_name: str) -> bool:
        """Whether a parameter serves every task (the encoder) rather than one task's head."""
        return parameter_name.startswith("bert.")

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return mean_pool(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]  # (B, H)

    def encode_sentences(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        hidden = self.bert.encode(self.bert.embed(input_ids, token_type_ids), attention_mask)
        return self.pool(hidden, attention_mask)  # (B, H)

    def encoder_inputs(self, task: str, batch: dict) -> EncoderInputs:
        """What the encoder reads for this task: SBERT pairs become both sides as one (2B, T) batch,
        one encoder pass instead of two."""
        if task == "sst" or self.pair_encoder == "cross":
            return EncoderInputs(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        length = max(batch["input_ids_1"].shape[1], batch["input_ids_2"].shape[1])
        ids = torch.cat([pad_to(batch["input_ids_1"], length), pad_to(batch["input_ids_2"], length)])
        mask = torch.cat([pad_to(batch["attention_mask_1"], length), pad_to(batch["attention_mask_2"], length)])
        return EncoderInputs(ids, mask, None)  # (2B, T) each

    def embed(self, inputs: EncoderInputs) -> tuple[torch.Tensor, ...]:
        return (self.bert.embed(inputs.input_ids, inputs.token_type_ids),)  # (B, T, H) or (2B, T, H)

    def outputs_from_embeddings(self, task: str, embeddings: tuple[torch.Tensor, ...],
                                attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = self.pool(self.bert.encode(embeddings[0], attention_mask), attention_mask)  # (B, H) or (2B, H)
        if task == "sst":
            return self.sentiment_head(self.dropout(pooled))  # (B, 5)
        if self.pair_encoder == "cross":
            head = self.paraphrase_head if task == "qqp" else self.similarity_head
            return head(self.dropout(pooled)).squeeze(-1)  # (B,)
        u, v = pooled.chunk(2)  # (B, H) each
        if task == "qqp":
            features = torch.cat([u, v, (u - v).abs()], dim=-1)  # (B, 3H)
            return self.paraphrase_head(self.dropout(features)).squeeze(-1)  # (B,)
        return F.cosine_similarity(u.float(), v.float(), dim=-1)  # (B,)

    def forward(self, task: str, batch: dict) -> torch.Tensor:
        inputs = self.encoder_inputs(task, batch)
        return self.outputs_from_embeddings(task, self.embed(inputs), inputs.attention_mask)

    def predict(self, task: str, batch: dict) -> torch.Tensor:
        """The task's prediction: SST class, QQP 0/1, STS score on 0-5."""
        return self.objectives[task].decode(self(task, batch).float())

    # The course's prediction API.
    def predict_sentiment(self, input_ids, attention_mask):
        return self("sst", {"input_ids": input_ids, "attention_mask": attention_mask})

    def predict_paraphrase(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        return self("qqp", {"input_ids_1": input_ids_1, "attention_mask_1": attention_mask_1,
                            "input_ids_2": input_ids_2, "attention_mask_2": attention_mask_2})

    def predict_similarity(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        return self.predict("sts", {"input_ids_1": input_ids_1, "attention_mask_1": attention_mask_1,
                                    "input_ids_2": input_ids_2, "attention_mask_2": attention_mask_2})


def model_metadata(model: nn.Module) -> dict:
    """What rebuilds the model without its pretrained source: the BERT config and the head options."""
    return {"bert_config": model.bert.config.to_dict(), "heads": model.head_options()}


def save_multitask_model(model: MultitaskBERT, prefix: Path, metadata: dict) -> None:
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_save(prefix, tensors, {**model_metadata(model), **metadata})


def load_multitask_model(prefix: str | Path, device: torch.device | str = "cpu") -> MultitaskBERT:
    """Rebuild a MultitaskBERT from PREFIX.safetensors + PREFIX.json (no pretrained download needed)."""
    tensors, metadata = read_checkpoint(Path(prefix))
    check_fields(Path(prefix).with_suffix(".json"), metadata, {"bert_config": dict, "heads": dict})
    try:
        model = MultitaskBERT(BertModel(BertConfig.from_dict(metadata["bert_config"])), **metadata["heads"])
        model.load_state_dict(tensors)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{prefix}: checkpoint does not describe a MultitaskBERT "
                              f"({type(err).__name__}: {err})") from None
    return model.to(device)
