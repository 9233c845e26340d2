"""Tasks whose examples are two sentences (QQP, STS): their files' two text columns, and the encodings of a pair the
model may read them by (MultitaskBERT's pair_encoders, per task):

    sbert   u, v pooled from two separate encodings (one (2B, T) batch)
    cross   one joint [CLS] s1 [SEP] s2 [SEP] encoding, pooled, a linear head -> 1 logit
    hybrid  the joint encoding, each sentence's own tokens mean-pooled into u and v (AllBERT, seed 004 eq. 5)
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor, nn

from minbert.tasks.base import TaskData, TaskModel
from minbert.tasks.course_files import PairExample, read_rows

PAIR_COLUMNS = ("sentence1", "sentence2")  # the text columns of the course's pair files


class PairData(TaskData):
    """The pair tasks' files; each kind says what its labels must be (label_problem)."""

    def load(self, path: str | Path, split: str) -> list[PairExample]:
        """Labels are floats (QQP 0.0 / 1.0, STS 0-5), None for split="test"."""
        task = self.task
        return [PairExample(example_id, sentence1, sentence2, label)
                for example_id, (sentence1, sentence2), label in read_rows(path, split, task.text_columns,
                                                                           task.label_column, self.label_problem,
                                                                           task.name)]

    @abstractmethod
    def label_problem(self, value: float) -> str | None:
        """What a label of its data files must be, when `value` is not one."""


def is_cross_encoded(task_name: str, pair_encoders: Mapping[str, str]) -> bool:
    return pair_encoders[task_name] == "cross"


class PairModel(TaskModel):
    """What the pair tasks' models share: a cross-encoded pair's one logit, or the kind's own use of the two
    sentence embeddings."""

    def build_head(self, in_features: int) -> nn.Module:
        return nn.Linear(in_features, 1)  # one logit

    def outputs(self, model: nn.Module, hidden: Tensor, inputs) -> Tensor:
        """A cross-encoded pair's logit: the pooled pair through the dense layer, dropout and the head; else what
        the task makes of the two sentence embeddings."""
        name = self.task.name
        if is_cross_encoded(name, model.pair_encoders):
            pooled = model.readout.head_input(name, hidden, inputs.attention_mask)
            return self.head(model)(pooled).squeeze(-1)  # (B,)
        u, v = model.readout.pair_embeddings(name, hidden, inputs.attention_mask, inputs.token_type_ids)  # (B, H) each
        return self.outputs_of_embeddings(model, u, v)

    @abstractmethod
    def outputs_of_embeddings(self, model: nn.Module, u: Tensor, v: Tensor) -> Tensor:
        """The task's outputs (B,) from the embeddings u and v (B, H) of the two sentences (SBERT, hybrid)."""
