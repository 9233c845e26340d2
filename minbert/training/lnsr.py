"""LNSR, layer-wise noise stability regularisation (Hua et al. 2021, "Noise Stability Regularization for
Improving BERT Fine-tuning"; AllBERT's choice for STS, seed 004 §A.2.2).

Gaussian noise is added to the output of encoder layer b (b = 0: the embedding output), and every
later layer r is asked to keep its output where it was:

    R_LNSR(x) = lambda * sum_{r = b+1}^{L} mean over real tokens of || f^{b,r}(h_b) - f^{b,r}(h_b + n) ||^2,
    n ~ N(0, sigma^2 I)

with one weight lambda for every r (lambda^{b,r} = lambda, as AllBERT tuned it). The clean pass is the
one the task loss reads, so LNSR costs one extra run of the layers above b. Both passes draw the same
dropout masks (the random state is replayed), so the penalty measures the response to the injected
noise rather than the disagreement of two dropout masks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from bert import BertEncoder, TokenLayout


@dataclass(frozen=True)
class LnsrConfig:
    weight: float = 0.005
    """lambda: weight of the summed squared output changes (AllBERT, STS full fine-tuning: 0.005)."""
    layer: int = 4
    """b: the noise is added to this layer's output (0: the embedding output); layers b+1..L are measured."""
    noise_std: float = math.sqrt(1e-5)
    """sigma (AllBERT: sigma^2 = 1e-5)."""

    def __post_init__(self):
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"LNSR weight must be finite and >= 0, got {self.weight!r}")
        if not (math.isfinite(self.noise_std) and self.noise_std > 0):
            raise ValueError(f"LNSR noise_std must be finite and > 0, got {self.noise_std!r}")
        if self.layer < 0:
            raise ValueError(f"LNSR layer must be >= 0, got {self.layer!r}")


def _random_state(device: torch.device) -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_random_state(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def encode_with_noise_stability(encoder: BertEncoder, embeddings: Tensor, attention_mask: Tensor,
                                config: LnsrConfig, layout: TokenLayout | None = None) -> tuple[Tensor, Tensor]:
    """The encoder's clean output (B, T, H) and lambda * R_LNSR for the batch (a scalar in float32); `layout`:
    the batch's (built from the mask if not given), shared by the three passes."""
    layout = layout if layout is not None else encoder.layout(attention_mask)
    if not config.layer < len(encoder.layers):
        raise ValueError(f"LNSR layer {config.layer} leaves no layer to measure in a {len(encoder.layers)}-layer "
                         f"encoder; use 0..{len(encoder.layers) - 1}")
    injected = encoder(embeddings, attention_mask, end=config.layer, layout=layout)  # (B, T, H): output of layer b
    noise = torch.randn_like(injected, dtype=torch.float32) * config.noise_std
    replay = _random_state(injected.device)
    clean_outputs: list[Tensor] = []
    hidden = encoder(injected, attention_mask, start=config.layer, layer_outputs=clean_outputs, layout=layout)
    after = _random_state(injected.device)
    _set_random_state(replay, injected.device)  # the noisy pass draws the clean pass's dropout masks
    noisy_outputs: list[Tensor] = []
    encoder(injected + noise.to(injected.dtype), attention_mask, start=config.layer, layer_outputs=noisy_outputs,
            layout=layout)
    _set_random_state(after, injected.device)
    real_tokens = attention_mask.sum().clamp_min(1)
    # Padding positions are zero in both passes, so sums over (B, T, H) count real tokens only.
    change = sum(((noisy.float() - clean.float()) ** 2).sum() for noisy, clean in zip(noisy_outputs, clean_outputs))
    return hidden, config.weight * change / real_tokens
