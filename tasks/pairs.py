"""Tasks whose examples are two sentences (QQP, STS): their files' two text columns, and the encodings of a pair the
model may read them by (MultitaskBERT's pair_encoders, per task):

    sbert   u, v pooled from two separate encodings (one (2B, T) batch)
    cross   one joint [CLS] s1 [SEP] s2 [SEP] encoding, pooled, a linear head -> 1 logit
    hybrid  the joint encoding, each sentence's own tokens mean-pooled into u and v (AllBERT, seed 004 eq. 5)
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import Tensor, nn

from tasks.course_files import PairExample, read_rows

PAIR_COLUMNS = ("sentence1", "sentence2")  # the text columns of the course's pair files


class SentencePairs:
    """What the pair tasks share, beside their own kind (a tasks.base.Task first in their bases: QQP's
    Classification, STS's Task)."""

    def load(self, path: str | Path, split: str) -> list[PairExample]:
        """Labels are floats (QQP 0.0 / 1.0, STS 0-5), None for split="test"."""
        return [PairExample(example_id, sentence1, sentence2, label)
                for example_id, (sentence1, sentence2), label in read_rows(path, split, self.text_columns,
                                                                           self.label_column, self.label_problem,
                                                                           self.name)]

    def is_cross_encoded(self, pair_encoders: Mapping[str, str]) -> bool:
        return pair_encoders[self.name] == "cross"

    def cross_encoded_logit(self, model: nn.Module, hidden: Tensor, inputs) -> Tensor:
        """A joint encoding's one logit: the pooled pair through the dense layer, dropout and the head."""
        return self.head(model)(model.head_input(self.name, hidden, inputs)).squeeze(-1)  # (B,)
