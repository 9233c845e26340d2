"""The nearest words to a word in a model's input-embedding space: the word_neighbour noise's replacements and the
greedy attack's candidates.

    neighbours = EmbeddingNeighbours(tokenizer.backend.get_vocab(), model.bert.embeddings.word_embeddings.weight, k=8)
    neighbours("film")       # ['films', 'movie', ...]: the k whole words of highest cosine, nearest first

Only whole words of the vocabulary are words here: entries of ASCII letters alone (no ## continuation, no [CLS] or
[unused0], no digits or punctuation). A word that is not one of them (it splits into word pieces) has no neighbours.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F


class EmbeddingNeighbours:
    """The k nearest whole words of a word by the cosine of their rows of the input (word-piece) embedding matrix,
    computed once per word asked."""

    def __init__(self, vocabulary: Mapping[str, int], embeddings: torch.Tensor, k: int):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.words = sorted(word for word in vocabulary if word.isascii() and word.isalpha())
        rows = torch.tensor([vocabulary[word] for word in self.words])
        self.unit = F.normalize(embeddings.detach().float().cpu()[rows], dim=-1)  # (W, H)
        self.place = {word: i for i, word in enumerate(self.words)}
        self.k = min(k, len(self.words) - 1)
        self._cache: dict[str, list[str]] = {}

    def __call__(self, word: str) -> list[str]:
        """`word`'s k nearest whole words (never itself), nearest first; [] when it is not a whole word."""
        if word not in self._cache:
            place = self.place.get(word)
            if place is None:
                self._cache[word] = []
            else:
                similarity = self.unit @ self.unit[place]
                similarity[place] = -float("inf")
                self._cache[word] = [self.words[i] for i in similarity.topk(self.k).indices.tolist()]
        return self._cache[word]
