"""The models and batches the benchmarks time: minBERT for --config (pretrained, or random weights of any checkpoint's
shape), placed as training places it; transformers.BertModel with the same weights (the peer, imported only when a
comparison asks for it); a MultitaskBERT with its optimizer and SMART on one fixed pair batch.
"""
from __future__ import annotations

from pathlib import Path

import torch

from base_bert import BertConfig, pretrained_config, resolve_pretrained
from bert import BertModel
from minbert.benchmarks.settings import BenchmarkSettings
from minbert.data.batches import row_lengths
from minbert.runtime import place_encoder
from optimizer import AdamW
from tokenizer import BertTokenizer


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_batch(batch_size: int, seq_len: int, vocab_size: int, device: torch.device, seed: int = 0,
               full_length: bool = False):
    """Random token ids and their attention mask: real lengths drawn from seq_len / 2 .. seq_len (the first
    sequence full), or all seq_len with `full_length` (no padding: the memory benchmark's worst case)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=generator)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size,), generator=generator)
    lengths[0] = seq_len
    if full_length:
        lengths[:] = seq_len
    mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


def place(bert: BertModel, device: torch.device, settings: BenchmarkSettings) -> BertModel:
    """minBERT on `device` as training places it (runtime.place_encoder), compiled under --compile; --token_layout
    packed or padded overrides the device's choice (to measure the other one)."""
    bert.to(device)
    place_encoder(bert.encoder, device, settings.compile, settings.compile_mode)
    if settings.token_layout != "auto":
        bert.encoder.pack_tokens = settings.token_layout == "packed"
    return bert


RANDOM = "random:"


def random_config(config: str, **overrides) -> BertConfig | None:
    """The BertConfig of a --config with random weights: bert-base's for "bert-base-random", a checkpoint's or a
    config.json's for "random:NAME_OR_PATH"; None for a pretrained checkpoint (weights to load)."""
    if config == "bert-base-random":
        return BertConfig(**overrides)
    if config.startswith(RANDOM):
        source = config[len(RANDOM):]
        file = Path(source).expanduser() if source.endswith(".json") else resolve_pretrained(source) / "config.json"
        return BertConfig.from_json_file(file, **overrides)
    return None


def random_twin(config: str) -> str:
    """The --config of random weights in the shape of `config` (itself when its weights are random already)."""
    return config if random_config_name(config) else RANDOM + config


def random_config_name(config: str) -> bool:
    return config == "bert-base-random" or config.startswith(RANDOM)


def build_minbert(settings: BenchmarkSettings, **overrides) -> BertModel:
    """minBERT alone for --config: random weights (bert-base-random, random:NAME_OR_PATH) or pretrained;
    `overrides` change its config (e.g. attention_probs_dropout_prob)."""
    torch.manual_seed(0)
    config = random_config(settings.config, **overrides)
    return BertModel(config) if config is not None else BertModel.from_pretrained(settings.config, **overrides)


def model_config(config: str) -> BertConfig:
    """The BertConfig of a --config, random or pretrained, read without any weights."""
    random_weights = random_config(config)
    return random_weights if random_weights is not None else pretrained_config(config)


RANDOM_WEIGHTS_TOKENIZER = "minilm-l6"  # bundled, and its vocabulary is bert-base-uncased's


def tokenizer_directory(config: str) -> str:
    """Where the tokenizer of --config lives: the checkpoint's own, or RANDOM_WEIGHTS_TOKENIZER for random weights
    (parse_args checks that the model's embedding table holds its vocabulary)."""
    return RANDOM_WEIGHTS_TOKENIZER if random_config_name(config) else config


def build_tokenizer(settings: BenchmarkSettings):
    return BertTokenizer.from_pretrained(tokenizer_directory(settings.config))


def build_encoders(settings: BenchmarkSettings, device):
    """minBERT and transformers.BertModel holding identical weights (random ones for a random --config: the
    transformers model's own initialisation, converted into minBERT)."""
    from transformers import BertConfig as HFConfig
    from transformers import BertModel as HFBertModel
    config = random_config(settings.config)
    if config is not None:
        from base_bert import convert_hf_state_dict
        torch.manual_seed(0)
        ours = BertModel(config)
        hf_config = {k: v for k, v in config.to_dict().items() if k != "attn_implementation"}
        reference = HFBertModel(HFConfig(**hf_config, attn_implementation="sdpa"))
        ours.load_state_dict(convert_hf_state_dict(reference.state_dict(), config.num_hidden_layers))
    else:
        ours = BertModel.from_pretrained(settings.config)
        reference = HFBertModel.from_pretrained(str(resolve_pretrained(settings.config)), attn_implementation="sdpa")
    return place(ours, device, settings).train(), reference.to(device).train()


def multitask_setup(settings: BenchmarkSettings, device, smart: bool, adapter: str | None = None,
                    checkpointing: bool = False, full_length: bool = False, smart_precision: str = "run",
                    **config_overrides):
    """A MultitaskBERT with its optimizer and (optionally) SMART, its passes at `smart_precision`, on one fixed
    STS-like pair batch; with an adapter kind, per-task adapters of rank 8 over a frozen encoder; `full_length`: no
    padding."""
    from minbert.model.adapters import AdapterConfig
    from minbert.model.multitask_bert import MultitaskBERT, freeze_encoder
    from smart import SmartConfig, SmartRegularizer
    bert = build_minbert(settings, **config_overrides)
    model = MultitaskBERT(bert, adapter=AdapterConfig(adapter) if adapter else None)
    if adapter:
        freeze_encoder(model)
    model.bert.encoder.gradient_checkpointing = checkpointing
    place(model.bert, device, settings)
    model = model.to(device).train()
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig(precision=smart_precision)) if smart else None
    ids_1, mask_1 = make_batch(settings.batch_size, settings.seq_len, bert.config.vocab_size, device, 1, full_length)
    ids_2, mask_2 = make_batch(settings.batch_size, settings.seq_len, bert.config.vocab_size, device, 2, full_length)
    batch = {"input_ids_1": ids_1, "attention_mask_1": mask_1, "input_ids_2": ids_2, "attention_mask_2": mask_2,
             "lengths_1": row_lengths(mask_1), "lengths_2": row_lengths(mask_2),
             "labels": torch.rand(settings.batch_size, device=device) * 5}
    return model, optimizer, regularizer, batch
