"""Where training changes the encoder: linear CKA (centred kernel alignment; Kornblith et al. 2019, "Similarity of
Neural Network Representations Revisited") between two models' representations of the same sentences, layer by
layer. 1 means the two layers represent the sentences alike up to a rotation and a scale; lower means rewritten.

    sentences = dev_sentences(data_dir, ("qqp", "sts", "sst"), 500)       # task -> SentenceExamples
    before = layer_representations(model_a, sentences, tokenizer, device)   # (L + 1, N, H)
    after = layer_representations(model_b, sentences, tokenizer, device)
    cka_by_layer(before, after)                                             # L + 1 floats, the embeddings first

A sentence's representation at a layer is the mean of its real tokens' states there (the embedding output, then
each layer's output), as the SBERT heads read the last one; each task's sentences run through that task's
adapters when the model has per-task ones.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from minbert.data.batches import in_file_order, load_split, make_dataloader
from minbert.model.multitask_bert import MultitaskBERT
from minbert.model.readout import mean_pool
from minbert.reports.plots import pyplot, save_figure
from minbert.runtime import to_device
from minbert.tasks.course_files import PairExample, SentenceExample


def linear_cka(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> float:
    """Linear CKA of two representations (N, D1) and (N, D2) of the same N inputs (rows):
    ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F) with Xc, Yc the column-centred matrices, in float64.
    In [0, 1], symmetric, and unchanged by an orthogonal transform, an isotropic scaling or a translation of
    either; the square of Pearson's r for one feature each."""
    x, y = (torch.as_tensor(m, dtype=torch.float64) for m in (x, y))
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"linear CKA needs (N, D) representations of the same N inputs, got {tuple(x.shape)} "
                         f"and {tuple(y.shape)}")
    x, y = x - x.mean(dim=0), y - y.mean(dim=0)
    norms = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    if norms == 0:
        raise ValueError("linear CKA is undefined for a representation that is the same for every input")
    return float(torch.linalg.matrix_norm(y.T @ x) ** 2 / norms)


def cka_by_layer(a: np.ndarray, b: np.ndarray) -> list[float]:
    """linear_cka of each layer's representations: `a`, `b` (layers, N, H) of the same N inputs."""
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"the models have different numbers of layers ({a.shape[0]} and {b.shape[0]})")
    return [linear_cka(x, y) for x, y in zip(a, b)]


def dev_sentences(data_dir: str | Path, tasks: Sequence[str], per_task: int) -> dict[str, list[SentenceExample]]:
    """task -> its dev split's first `per_task` texts as sentences (a pair's first sentence: the SBERT heads
    encode each sentence of a pair alone), a fixed sample for comparing models."""
    sample = {}
    for task in tasks:
        examples = load_split(data_dir, task, "dev")[:per_task]
        sample[task] = [SentenceExample(e.id, e.sentence1, None) if isinstance(e, PairExample) else e
                        for e in examples]
    return sample


@torch.inference_mode()
def layer_representations(model: MultitaskBERT, sentences: Mapping[str, Sequence[SentenceExample]], tokenizer,
                          device: torch.device, batch_size: int = 64, max_length: int = 128) -> np.ndarray:
    """(L + 1, N, H) float32 in float32 arithmetic: every sentence's mean-pooled token states after the embeddings and
    after each of the L layers, the tasks' sentences one after another in `sentences`' order (each through its
    task's adapters)."""
    model.eval()
    parts = []
    for task, examples in sentences.items():
        model.set_adapter(task)
        loader = make_dataloader(list(examples), tokenizer, batch_size, shuffle=False, max_length=max_length)
        ids, pooled = [], []
        for batch in loader:
            batch = to_device(batch, device)
            mask = batch["attention_mask"]
            hidden = model.bert.embed(batch["input_ids"])
            outputs = [hidden]
            model.bert.encoder(hidden, mask, layer_outputs=outputs)
            pooled.append(torch.stack([mean_pool(h, mask) for h in outputs], dim=1).float().cpu().numpy())
            ids += batch["ids"]
        parts.append(in_file_order(examples, ids, np.concatenate(pooled))[1])  # (N_task, L + 1, H)
    return np.concatenate(parts).transpose(1, 0, 2)


def cka_matrices(representations: Sequence[np.ndarray], spans: Mapping[str, slice]) -> dict[str, np.ndarray]:
    """For each span of sentences (a name -> its rows: all of them, each task's), the (layers, M, M) linear CKA of
    every pair of the M models' `representations` (layer_representations' arrays of the same sentences)."""
    count, layers = len(representations), representations[0].shape[0]
    matrices = {}
    for name, rows in spans.items():
        matrix = np.ones((layers, count, count))
        for i in range(count):
            for j in range(i + 1, count):
                matrix[:, i, j] = matrix[:, j, i] = cka_by_layer(representations[i][:, rows],
                                                                 representations[j][:, rows])
        matrices[name] = matrix
    return matrices


def sentence_spans(sentences: Mapping[str, Sequence]) -> dict[str, slice]:
    """"all" and each task -> the rows of its sentences in layer_representations' arrays."""
    spans, start = {"all": slice(0, sum(len(s) for s in sentences.values()))}, 0
    for task, examples in sentences.items():
        spans[task] = slice(start, start + len(examples))
        start += len(examples)
    return spans


def with_start(matrix: np.ndarray, starts: Sequence[int | None]) -> np.ndarray:
    """(models - 1, layers): each model's CKA with the model its stage began from (starts[m], a model's position;
    model 0, the one before training, has none), layer by layer, from a (layers, M, M) matrix of cka_matrices."""
    return np.array([matrix[:, m, start] for m, start in enumerate(starts) if start is not None])


def plot_stage_cka(values: np.ndarray, stages: Sequence[str], layers: Sequence[str], title: str,
                   path: str | Path) -> Path:
    """Heat map of (stages, layers) CKA values (with_start's), each written in its cell."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.1 * len(layers) + 2.5, 0.55 * len(stages) + 1.8))
    image = ax.imshow(values, cmap="viridis", vmin=min(0.5, float(values.min())), vmax=1.0, aspect="auto")
    for row in range(values.shape[0]):
        for col in range(values.shape[1]):
            ax.text(col, row, f"{values[row, col]:.3f}", ha="center", va="center", fontsize=8,
                    color="white" if values[row, col] < 0.8 else "black")
    ax.set_xticks(range(len(layers)), layers, rotation=30, ha="right")
    ax.set_yticks(range(len(stages)), stages)
    ax.set_xlabel("representation (mean-pooled tokens)")
    ax.set_ylabel("stage, against the model it began from")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label="linear CKA")
    return save_figure(fig, path)


def plot_cka_comparison(curves: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path,
                        columns: int = 4) -> Path:
    """One panel per comparison (title -> {run name -> CKA per layer, the embeddings first}), a line per run, the
    layers along x; `columns` panels a row."""
    plt = pyplot()
    rows = -(-len(curves) // columns)
    columns = min(columns, len(curves))
    fig, axes = plt.subplots(rows, columns, figsize=(3.3 * columns, 2.9 * rows), sharey=True, squeeze=False)
    bottom = min(min(values) for panel in curves.values() for values in panel.values())
    for ax, (title, panel) in zip(axes.flat, curves.items()):
        for name, values in panel.items():
            ax.plot(range(len(values)), values, marker="o", markersize=3, label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(next(iter(panel.values())))))
        ax.set_ylim(min(0.5, bottom - 0.02), 1.005)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(curves):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("linear CKA")
    axes[0][0].legend(fontsize=7)
    fig.supxlabel("layer (0: the embeddings)", fontsize=9)
    return save_figure(fig, path)
