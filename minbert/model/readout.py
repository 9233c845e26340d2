"""What a task's head reads of the encoder's last hidden states (MultitaskBERT.readout; the tasks call it from their
`outputs`): the pooled sequence, a pair's two sentence embeddings u and v, each task's dense layer and the heads'
dropout. It holds no weights of its own: the dense layers and the dropout stay the model's modules (their names
in the model's state_dict, and so in every checkpoint, are unchanged), the readout only applies them."""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

POOLINGS = ("mean", "cls")


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the non-padding token states."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, H)


class Readout:
    """Pooling (mean or [CLS]), the pair encoders' u and v, the dense layers (head_hidden > 0) and the dropout."""

    def __init__(self, pooling: str, pair_encoders: Mapping[str, str], dense_heads: nn.ModuleDict | None,
                 dropout: nn.Dropout):
        self.pooling, self.pair_encoders = pooling, pair_encoders
        self.dense_heads, self.dropout = dense_heads, dropout

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return mean_pool(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]  # (B, H)

    def features(self, task: str, features: torch.Tensor) -> torch.Tensor:
        """The task's own dense layer (head_hidden > 0), else the features as they are."""
        return features if self.dense_heads is None else self.dense_heads[task](features)

    def head_input(self, task: str, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """What a linear head on the pooled sequence reads: the pooled (B, H), through the task's dense layer and
        the heads' dropout."""
        return self.dropout(self.features(task, self.pool(hidden, attention_mask)))

    def pair_embeddings(self, task: str, hidden: torch.Tensor, attention_mask: torch.Tensor,
                        token_type_ids: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """u and v (B, H) each of a pair task read by SBERT (hidden: both sides, (2B, T, H)) or hybrid (one joint
        encoding, [CLS] s1 [SEP] segment 0 and s2 [SEP] segment 1)."""
        if self.pair_encoders[task] == "sbert":
            return self.pool(hidden, attention_mask).chunk(2)
        second = token_type_ids.bool() & attention_mask.bool()  # (B, T)
        return mean_pool(hidden, attention_mask.bool() & ~second), mean_pool(hidden, second)
