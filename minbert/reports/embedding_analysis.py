"""What the encoder makes of SST sentences: the pooled sentence embeddings that the SST head reads
(through the SST adapter when there is one), projected to 2-D by t-SNE (scikit-learn) and coloured by
the gold label, for one model or several side by side (e.g. before and after an SST stage, from the
stage_N checkpoints of --keep_stage_models).

    embeddings = sentence_embeddings(model, "sst", examples, tokenizer, device)   # (N, H)
    plot_tsne({"after SST": embeddings}, labels, "runs/x/sst_tsne.png")
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from minbert.data.batches import in_file_order, make_dataloader
from minbert.model.multitask_bert import MultitaskBERT
from minbert.reports.plots import pyplot, save_figure
from minbert.runtime import autocast, to_device

MIN_TSNE_POINTS = 5  # t-SNE's perplexity must stay below the number of points
SST_CLASS_NAMES = ("0 negative", "1 somewhat negative", "2 neutral", "3 somewhat positive", "4 positive")


@torch.inference_mode()
def sentence_embeddings(model: MultitaskBERT, task: str, examples: Sequence, tokenizer, device: torch.device,
                        batch_size: int = 64, max_length: int = 128, precision: str = "fp32") -> np.ndarray:
    """(N, H) float32: each single-sentence example's pooled embedding through `task`'s adapters (what the
    task's head reads of a single sentence), in the examples' order; `precision` a resolved one (runtime.py)."""
    model.eval()
    model.set_adapter(task)
    loader = make_dataloader(list(examples), tokenizer, batch_size, shuffle=False, max_length=max_length)
    ids, parts = [], []
    for batch in loader:
        batch = to_device(batch, device)
        with autocast(device, precision):
            pooled = model.encode_sentences(batch["input_ids"], batch["attention_mask"])  # (B, H)
        parts.append(pooled.float().cpu().numpy())
        ids += batch["ids"]
    return in_file_order(examples, ids, np.concatenate(parts))[1]


def tsne_points(embeddings: np.ndarray, seed: int = 0) -> np.ndarray:
    """(N, 2) t-SNE of the embeddings (PCA start, so that reruns and nearby models look alike)."""
    if len(embeddings) < MIN_TSNE_POINTS:
        raise ValueError(f"t-SNE needs at least {MIN_TSNE_POINTS} points, got {len(embeddings)}")
    from sklearn.manifold import TSNE  # here, not at the top: importing scikit-learn takes seconds

    perplexity = min(30.0, (len(embeddings) - 1) / 3)
    return TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=seed).fit_transform(embeddings)


def plot_tsne(panels: Mapping[str, np.ndarray], labels: Sequence[int], path: str | os.PathLike,
              seed: int = 0) -> Path:
    """One t-SNE scatter per panel (title -> (N, H) embeddings of the same sentences), coloured by gold class."""
    plt = pyplot()
    labels = np.asarray(labels, dtype=int)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False)
    colours = plt.get_cmap("coolwarm")(np.linspace(0, 1, len(SST_CLASS_NAMES)))
    for ax, (title, embeddings) in zip(axes[0], panels.items()):
        points = tsne_points(embeddings, seed)
        for cls, name in enumerate(SST_CLASS_NAMES):
            chosen = labels == cls
            ax.scatter(points[chosen, 0], points[chosen, 1], s=6, color=colours[cls], label=name, alpha=0.8)
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][-1].legend(loc="best", fontsize=7, markerscale=2)
    return save_figure(fig, path)
