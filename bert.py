"""minBERT: the BERT encoder written from scratch.

Class order follows the original: embeddings -> self-attention -> layer -> encoder -> pooler -> model.
The course's split API is kept so that the embedding output is reachable (SMART perturbs it):

    hidden = bert.embed(input_ids, token_type_ids)          # (B, T, H)
    hidden = bert.encode(hidden, attention_mask)            # (B, T, H)
    outputs = bert(input_ids, attention_mask)               # {'last_hidden_state', 'pooler_output'}

Shapes: B batch, T tokens, N real (non-padding) tokens, H hidden, nh heads, hs head size (H = nh * hs).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from base_bert import BertConfig, BertPreTrainedModel


class BertEmbeddings(nn.Module):
    """Sum of word, position and segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence of {seq_len} tokens is longer than the model's "
                             f"{self.position_embeddings.num_embeddings} positions; truncate it")
        positions = torch.arange(seq_len, device=input_ids.device)  # (T,)
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions)  # (B, T, H)
        if token_type_ids is None:
            # Segment 0 everywhere: add its one row instead of looking up a tensor of zeros.
            hidden = hidden + self.token_type_embeddings.weight[0]
        else:
            hidden = hidden + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layer_norm(hidden))


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product attention with one fused Q/K/V projection."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.implementation = config.attn_implementation

    def attention(self, query, key, value, key_mask: torch.Tensor | None) -> torch.Tensor:
        """The handout's softmax(QK^T / sqrt(hs)) V, written out; `key_mask` (B, 1, 1, T) is True where attended
        (None: every key is)."""
        scores = query @ key.transpose(-2, -1) / math.sqrt(self.head_size)  # (B, nh, T, T)
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
        probs = F.dropout(scores.softmax(dim=-1), p=self.dropout_p, training=self.training)
        return probs @ value  # (B, nh, T, hs)

    def forward(self, tokens: torch.Tensor, key_mask: torch.Tensor | None, layout: "TokenLayout") -> torch.Tensor:
        B, T = layout.batch_size, layout.seq_len
        H = tokens.shape[-1]
        qkv = layout.unpack(self.qkv(tokens))  # (B, T, 3H): projections run on real tokens only
        query, key, value = qkv.view(B, T, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4).unbind(0)
        # query, key, value: (B, nh, T, hs) each
        if self.implementation == "sdpa":
            context = F.scaled_dot_product_attention(
                query, key, value, attn_mask=key_mask,
                dropout_p=self.dropout_p if self.training else 0.0)  # (B, nh, T, hs)
        else:
            context = self.attention(query, key, value, key_mask)
        context = layout.pack(context.transpose(1, 2).reshape(B, T, H))  # (N, H)
        return self.out_proj(context)


class BertLayer(nn.Module):
    """Post-LayerNorm transformer block: attention, add & norm, feed-forward (exact GELU), add & norm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # A callable (tokens, key_mask, layout) -> (N, H) or None run beside the attention (adapters.py's
        # PALs); not a module, so whoever owns its weights registers them.
        self.parallel = None

    def add_norm(self, residual: torch.Tensor, sublayer_output: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """Dropout on the sub-layer output before it is added to its input and normalised."""
        return norm(residual + self.dropout(sublayer_output))

    def feed_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ffn_out(F.gelu(self.ffn_in(hidden)))  # (N, H)

    def forward(self, tokens: torch.Tensor, key_mask: torch.Tensor, layout: "TokenLayout") -> torch.Tensor:
        attended = self.attention(tokens, key_mask, layout)
        beside = self.parallel(tokens, key_mask, layout) if self.parallel is not None else None
        if beside is not None:
            # LN(h + SA(h) + PAL(h)), the feed-forward then reading it: the PAL inside the attention's add & norm, as
            # Stickland & Murray's eq. 3 writes a task-specific function beside a layer. Their released code
            # (Bert-n-Pals' BERTLayer.forward) and seed 003 (its eq. 4) add the same PAL(h) at the layer's output
            # instead, LN(h_att + FFN(h_att) + PAL(h)) with h_att = LN(h + SA(h)), the feed-forward not seeing it.
            attended = attended + beside
        tokens = self.add_norm(tokens, attended, self.attention_norm)
        return self.add_norm(tokens, self.feed_forward(tokens), self.output_norm)  # (N, H)


def host_indices(indices: np.ndarray, device: torch.device) -> torch.Tensor:
    """Indices computed on the host, as a tensor on `device` that nothing waits for: on CUDA copied from pinned
    memory (a copy from pageable memory first waits for the device's queue to drain)."""
    tensor = torch.from_numpy(indices)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


class TokenLayout:
    """Where the N real tokens of a right-padded (B, T) batch sit, decided on the host once per batch.

    Packed (the CPU's default, BENCHMARKS' 1.27x): every token-wise operation (projections, feed-forward,
    LayerNorm, dropout) runs on the packed (N, H) real tokens only, so padding costs nothing there; attention
    alone needs the (B, T) grid. Padded (CUDA's default): every operation runs on the whole (B*T, H) grid, so a
    step's shapes depend on (B, T) alone (length buckets make them repeat: torch.compile and CUDA graphs reuse
    them) and no kernel waits for a count of real tokens. Either way padding positions of the encoder output are
    zero and the outputs of real tokens agree within float rounding.

    Built from the rows' lengths as the host knows them (the collate's `lengths`), the layout reads nothing
    back from the device. Without them a packed layout must read the mask back (one host sync per batch); a
    padded one then attends through the mask even when no row is padded.
    """

    def __init__(self, attention_mask: torch.Tensor, positions: torch.Tensor | None, padded: bool | None):
        """`positions`: (N,) flat indices of the real tokens, or None to run on the whole grid; `padded`:
        whether some row is padded (None: not known on the host)."""
        self.batch_size, self.seq_len = attention_mask.shape
        self.positions = positions
        # (B, 1, 1, T): padding keys are never attended. Without padding no mask at all: SDPA's flash kernel
        # takes no mask, so any mask, even all True, rules it out.
        self.key_mask = None if padded is False else attention_mask.bool()[:, None, None, :]
        # (B, T, 1): zeroes the padding rows a grid computation leaves (packed ones are zero already)
        self.real = attention_mask[..., None] if positions is None and padded is not False else None

    @classmethod
    def build(cls, attention_mask: torch.Tensor, lengths=None, pack: bool = True) -> "TokenLayout":
        """The layout of a batch; `lengths`: each row's real-token count on the host (an int array or list), for
        right-padded rows, or None to read them from the mask."""
        batch_size, seq_len = attention_mask.shape
        if lengths is not None:
            lengths = np.asarray(lengths, dtype=np.int64)
            if lengths.shape != (batch_size,) or lengths.min(initial=seq_len) < 0 or lengths.max(initial=0) > seq_len:
                raise ValueError(f"lengths {lengths.tolist()} do not fit a ({batch_size}, {seq_len}) batch")
            padded = bool((lengths < seq_len).any())
            if not (pack and padded):
                return cls(attention_mask, None, padded)
            flat = np.flatnonzero(np.arange(seq_len) < lengths[:, None])  # (N,) on the host
            return cls(attention_mask, host_indices(flat, attention_mask.device), True)
        if not pack:
            return cls(attention_mask, None, None)
        flat = attention_mask.reshape(-1).bool()  # (B*T,)
        if bool(flat.all()):  # reads the mask back: the host sync that host lengths avoid
            return cls(attention_mask, None, False)
        return cls(attention_mask, flat.nonzero().squeeze(1), True)

    def pack(self, grid: torch.Tensor) -> torch.Tensor:
        flat = grid.reshape(self.batch_size * self.seq_len, grid.shape[-1])  # (B*T, D)
        return flat if self.positions is None else flat.index_select(0, self.positions)  # (N, D) or (B*T, D)

    def unpack(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.positions is not None:
            # In place into fresh zeros: the out-of-place index_copy would first copy the whole grid.
            grid = tokens.new_zeros(self.batch_size * self.seq_len, tokens.shape[-1])
            tokens = grid.index_copy_(0, self.positions, tokens)  # (B*T, D)
        return tokens.view(self.batch_size, self.seq_len, tokens.shape[-1])  # (B, T, D)

    def output(self, tokens: torch.Tensor) -> torch.Tensor:
        """The encoder's (B, T, D) output of its tokens, zero at padding positions."""
        grid = self.unpack(tokens)
        return grid if self.real is None else grid * self.real.to(grid.dtype)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        # Recompute each layer in the backward pass instead of keeping its activations (training only): less
        # memory for bert-large or long sequences, about one more forward of time. The dropout masks are
        # replayed, so outputs and gradients are unchanged.
        self.gradient_checkpointing = False
        # Token-wise operations on the real tokens only (TokenLayout): the CPU's default; runtime.place_model
        # turns it off on CUDA, where the padded grid keeps shapes static and no kernel waits on a token count.
        self.pack_tokens = True

    def layout(self, attention_mask: torch.Tensor, lengths=None) -> TokenLayout:
        """This encoder's TokenLayout of a batch (`lengths`: the rows' real-token counts on the host, if known)."""
        return TokenLayout.build(attention_mask, lengths, self.pack_tokens)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int = 0, end: int | None = None,
                layer_outputs: list | None = None, layout: TokenLayout | None = None) -> torch.Tensor:
        """Layers start .. end - 1 (all by default) on `hidden`, the input of layer `start` (the embedding
        output for 0); returns the last one's output (B, T, H). `layer_outputs`, when given, receives the
        output (B, T, H) of every layer run (LNSR compares them). `layout`: the batch's, built once for all of
        its passes (SMART, LNSR); by default built here from the mask."""
        layout = layout if layout is not None else self.layout(attention_mask)
        return self.run_layers(hidden, layout, start, end, layer_outputs)

    def run_layers(self, hidden: torch.Tensor, layout: TokenLayout, start: int = 0, end: int | None = None,
                   layer_outputs: list | None = None) -> torch.Tensor:
        """forward's work once the layout is known: no data-dependent step, so that it compiles as one graph."""
        tokens = layout.pack(hidden)  # (N, H)
        for layer in self.layers[start:end]:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                tokens = checkpoint(layer, tokens, layout.key_mask, layout, use_reentrant=False)
            else:
                tokens = layer(tokens, layout.key_mask, layout)
            if layer_outputs is not None:
                layer_outputs.append(layout.output(tokens))
        return layout.output(tokens)  # (B, T, H)

    def compile_layers(self, mode: str | None = None, backend: str = "inductor") -> None:
        """torch.compile the layers (forward and backward) as one graph, fullgraph: a graph break is an error, not
        a silent slowdown. The module and its state dict keep their names (checkpoints are unchanged); the
        layout stays eager, so a batch without host lengths (TokenLayout.build) still works. `mode`: torch's
        (None, "reduce-overhead": CUDA graphs, "max-autotune")."""
        self.run_layers = torch.compile(self.run_layers, fullgraph=True, mode=mode, backend=backend)


class BertPooler(nn.Module):
    """Dense + tanh on the [CLS] hidden state."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, H)


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)
        self.init_weights()

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.embeddings(input_ids, token_type_ids)  # (B, T, H)

    def encode(self, hidden: torch.Tensor, attention_mask: torch.Tensor,
               layout: TokenLayout | None = None) -> torch.Tensor:
        return self.encoder(hidden, attention_mask, layout=layout)  # (B, T, H)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        hidden = self.encode(self.embed(input_ids, token_type_ids), attention_mask)
        return {"last_hidden_state": hidden, "pooler_output": self.pooler(hidden)}
