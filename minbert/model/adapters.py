"""Parameter-efficient adapters for minBERT, one set per task or one shared set.

    lora  W x + (alpha / r) B A x                           (Hu et al. 2021; B starts at zero)
    dora  m * (W + (alpha / r) B A) / ||W + (alpha / r) B A||_row applied to x, m starting at ||W||_row
                                                             (Liu et al. 2024; the norm is a constant in the
                                                             backward, as the paper's section 4.3 and peft)
    pals  a projected attention layer beside each BERT layer, added to its attention sub-layer:
          LN(h + SA(h) + V_D MH(V_E h)), then the feed-forward; V_E and V_D shared across the layers of a task,
          MH a small multi-head attention per layer  (Stickland & Murray 2019's equation; V_D starts at zero).
          Their released code and seed 003 add the same term at the layer's output instead,
          LN(h_att + FFN(h_att) + V_D MH(V_E h)) with h_att = LN(h + SA(h)) (bert.py's BertLayer.forward).

LoRA and DoRA wrap a layer's nn.Linear (kept as `base_layer`, as peft does). minBERT fuses Q, K and V
into one `qkv` projection: targeting query and value adapts those row slices of it, each with its own
A and B exactly as separate Q and V layers would have, and the fused projection still runs as one
matmul. Every adapter starts as the identity, so a fresh adapter reproduces the base model.

Routing: `activate(bert, name)` picks the set the next forward passes run (MultitaskBERT does it per
task); BertModel's signatures are unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bert import BertModel

ADAPTERS = ("none", "lora", "dora", "pals")
SHARINGS = ("per_task", "shared")
SHARED_SET = "shared"
# Target name -> (module path inside a BertLayer, which third of its output rows; None: all rows).
TARGETS = {"query": ("attention.qkv", 0), "key": ("attention.qkv", 1), "value": ("attention.qkv", 2),
           "attention_output": ("attention.out_proj", None), "ffn_in": ("ffn_in", None), "ffn_out": ("ffn_out", None)}


@dataclass(frozen=True)
class AdapterConfig:
    kind: str = "lora"
    rank: int = 8
    alpha: float = 8.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("query", "value")
    sharing: str = "per_task"
    pal_size: int | None = None  # PALs' hidden size; default: 204 / 768 of BERT's, a multiple of its heads

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))  # a checkpoint's JSON gives a list
        if self.kind not in ADAPTERS[1:]:
            raise ValueError(f"adapter must be one of {ADAPTERS[1:]}, got {self.kind!r}")
        if self.sharing not in SHARINGS:
            raise ValueError(f"adapter sharing must be one of {SHARINGS}, got {self.sharing!r}")
        if self.rank < 1 or not (math.isfinite(self.alpha) and self.alpha > 0) or not 0 <= self.dropout < 1:
            raise ValueError("adapter rank must be >= 1, alpha > 0 and dropout in [0, 1)")
        unknown = set(self.targets) - set(TARGETS)
        if self.kind != "pals" and (unknown or not self.targets):
            raise ValueError(f"adapter targets must be some of {tuple(TARGETS)}, got {self.targets!r}")


class LowRankUpdate(nn.Module):
    """A and B of one adapted weight block (out, in); with dora, also its magnitude m (out,)."""

    def __init__(self, base_weight: torch.Tensor, rank: int, alpha: float, dora: bool):
        super().__init__()
        out_features, in_features = base_weight.shape
        self.scaling = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, dtype=base_weight.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's (and peft's) initialisation
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, dtype=base_weight.dtype))
        self.magnitude = nn.Parameter(base_weight.detach().norm(dim=1)) if dora else None  # (out,)

    def delta_weight(self) -> torch.Tensor:
        return self.scaling * (self.lora_B @ self.lora_A)  # (out, in)

    def merged_weight(self, base_weight: torch.Tensor) -> torch.Tensor:
        """The plain weight this update amounts to."""
        combined = base_weight + self.delta_weight()
        if self.magnitude is None:
            return combined
        return (self.magnitude / combined.norm(dim=1))[:, None] * combined

    def forward(self, x: torch.Tensor, dropped: torch.Tensor, base_output: torch.Tensor, base_weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        """This block's adapted output, from its base output (bias included) and the input x."""
        update = F.linear(F.linear(dropped, self.lora_A), self.lora_B) * self.scaling  # (N, out)
        if self.magnitude is None:
            return base_output + update
        norm = (base_weight + self.delta_weight()).norm(dim=1).detach()  # (out,)
        scale = (self.magnitude / norm).to(base_output.dtype)
        # As peft: the base part is rescaled too, read from the undropped input when there is no dropout.
        base = base_output - bias if bias is not None else base_output
        if dropped is not x:
            base = F.linear(dropped, base_weight.to(dropped.dtype))
        return base_output + (scale - 1) * base + scale * update


class AdaptedLinear(nn.Module):
    """An nn.Linear (`base_layer`) plus named sets of low-rank updates on some of its row slices."""

    def __init__(self, base_layer: nn.Linear, slices: dict[str, slice], config: AdapterConfig, set_names):
        super().__init__()
        self.base_layer = base_layer
        self.slices = slices
        self.dropout = nn.Dropout(config.dropout)
        self.adapters = nn.ModuleDict({
            name: nn.ModuleDict({target: LowRankUpdate(base_layer.weight[rows], config.rank, config.alpha,
                                                       config.kind == "dora")
                                 for target, rows in slices.items()})
            for name in set_names})
        self.active: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self.base_layer(x)  # (N, out)
        if self.active is None:
            return output
        dropped = self.dropout(x)
        weight, bias = self.base_layer.weight, self.base_layer.bias
        adapted = {target: self.adapters[self.active][target](
            x, dropped, output[..., rows], weight[rows], None if bias is None else bias[rows])
            for target, rows in self.slices.items()}
        # Written into the base output in place: its backward needs only x and W, not the output itself,
        # and a concatenation would allocate the whole (N, out) block again.
        for target, rows in self.slices.items():
            output[..., rows] = adapted[target]
        return output

    def merged(self, name: str) -> nn.Linear:
        """A plain nn.Linear equal to this layer with adapter set `name`."""
        weight = self.base_layer.weight.detach().clone()
        with torch.no_grad():
            for target, rows in self.slices.items():
                weight[rows] = self.adapters[name][target].merged_weight(weight[rows])
        merged = nn.Linear(weight.shape[1], weight.shape[0], bias=self.base_layer.bias is not None)
        with torch.no_grad():
            merged.weight.copy_(weight)
            if self.base_layer.bias is not None:
                merged.bias.copy_(self.base_layer.bias)
        return merged


class ProjectedAttention(nn.Module):
    """One layer's multi-head attention inside a PAL's small space (size P, nh heads)."""

    def __init__(self, size: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_size = num_heads, size // num_heads
        self.qkv = nn.Linear(size, 3 * size)
        self.out_proj = nn.Linear(size, size)

    def forward(self, small: torch.Tensor, key_mask: torch.Tensor | None, layout) -> torch.Tensor:
        B, T = layout.batch_size, layout.seq_len
        qkv = layout.unpack(self.qkv(small))  # (B, T, 3P)
        query, key, value = qkv.view(B, T, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4).unbind(0)
        context = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask)  # (B, nh, T, hs)
        return self.out_proj(layout.pack(context.transpose(1, 2).reshape(B, T, -1)))  # (N, P)


class PalSet(nn.Module):
    """One task's PALs: V_E (H -> P) and V_D (P -> H) shared by all layers, one attention per layer."""

    def __init__(self, hidden: int, size: int, num_heads: int, num_layers: int):
        super().__init__()
        self.encoder = nn.Linear(hidden, size, bias=False)  # V_E
        self.decoder = nn.Linear(size, hidden, bias=False)  # V_D
        nn.init.zeros_(self.decoder.weight)  # a fresh PAL adds nothing: the base model's outputs at the start
        self.layers = nn.ModuleList(ProjectedAttention(size, num_heads) for _ in range(num_layers))

    def forward(self, index: int, tokens: torch.Tensor, key_mask: torch.Tensor, layout) -> torch.Tensor:
        return self.decoder(self.layers[index](self.encoder(tokens), key_mask, layout))  # (N, H)


class Pals(nn.Module):
    """The PAL sets of a model; each BertLayer calls `parallel(index, ...)` through a plain hook."""

    def __init__(self, bert: BertModel, config: AdapterConfig, set_names):
        super().__init__()
        hidden, heads = bert.config.hidden_size, bert.config.num_attention_heads
        size = config.pal_size or heads * max(1, round(hidden * 204 / 768 / heads))
        if size % heads:
            raise ValueError(f"PAL size {size} is not a multiple of the {heads} attention heads")
        self.sets = nn.ModuleDict({name: PalSet(hidden, size, heads, bert.config.num_hidden_layers)
                                   for name in set_names})
        self.active: str | None = None
        for index, layer in enumerate(bert.encoder.layers):
            layer.parallel = _PalHook(self, index)

    def parallel(self, index: int, tokens, key_mask, layout) -> torch.Tensor | None:
        return None if self.active is None else self.sets[self.active](index, tokens, key_mask, layout)


class _PalHook:
    """What a BertLayer holds: a callable, not a module, so the PAL weights are registered once (in Pals)."""

    def __init__(self, pals: Pals, index: int):
        self.pals, self.index = pals, index

    def __call__(self, tokens, key_mask, layout):
        return self.pals.parallel(self.index, tokens, key_mask, layout)


def add_adapters(bert: BertModel, config: AdapterConfig, set_names) -> Pals | None:
    """Put adapter sets named `set_names` into `bert` (in place). LoRA / DoRA wrap the targeted linears;
    PALs return the module that owns their weights (the caller registers it)."""
    set_names = list(set_names)
    if config.kind == "pals":
        return Pals(bert, config, set_names)
    hidden = bert.config.hidden_size
    for layer in bert.encoder.layers:
        by_module: dict[str, dict[str, slice]] = {}
        for target in config.targets:
            path, third = TARGETS[target]
            rows = slice(0, None) if third is None else slice(third * hidden, (third + 1) * hidden)
            by_module.setdefault(path, {})[target] = rows
        for path, slices in by_module.items():
            parent_path, _, name = path.rpartition(".")
            parent = layer.get_submodule(parent_path) if parent_path else layer
            base = getattr(parent, name)
            slices = {t: slice(r.start, base.out_features if r.stop is None else r.stop) for t, r in slices.items()}
            setattr(parent, name, AdaptedLinear(base, slices, config, set_names))
    return None


def adapter_modules(model: nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, (AdaptedLinear, Pals))]


def activate(model: nn.Module, name: str | None) -> None:
    """Run adapter set `name` (a task, or SHARED_SET) in the next forward passes; None: the base model."""
    for module in adapter_modules(model):
        module.active = name


def merge_adapters(bert: BertModel, name: str) -> BertModel:
    """A plain minBERT (a new model; `bert` is unchanged) whose weights include LoRA / DoRA set `name`."""
    if any(layer.parallel is not None for layer in bert.encoder.layers):
        raise ValueError("PALs add layers of their own and cannot be merged into BERT's weights")
    merged = BertModel(bert.config)
    state = {}
    for module_name, module in bert.named_modules():
        if isinstance(module, AdaptedLinear):
            linear = module.merged(name)
            state[f"{module_name}.weight"], state[f"{module_name}.bias"] = linear.weight, linear.bias
    for key, value in bert.state_dict().items():
        if ".base_layer." not in key and ".adapters." not in key:
            state[key] = value
    merged.load_state_dict(state)
    return merged
