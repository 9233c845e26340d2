"""MultitaskBERT: one shared minBERT with a head per task (minbert/tasks/: each task builds its own head and
computes its outputs from the encoder's hidden states; this module holds what the heads share):

    pooling       mean or [CLS] of a sentence's (or a joint pair's) last hidden states
    pair encoders each pair task (qqp, sts) reads its pairs in one of three ways (pair_encoders, per task):
      sbert   u, v pooled from two separate encodings, run as one (2B, T) batch
      cross   one joint [CLS] s1 [SEP] s2 [SEP] encoding (segment ids 0 / 1), pooled
      hybrid  the joint encoding, each sentence's own tokens mean-pooled into u and v (AllBERT, seed 004 eq. 5)
    dense heads   with head_hidden > 0 each task's features first pass a dense layer of its own (linear ->
                  activation -> dropout, a per-task copy of BERT's pooler as in AllBERT)
    dropout       before each task's linear head (and, with STS's sts_cosine_dropout, on both embeddings before
                  its cosine, as the thesis' listing A.6 does)
    task options  what a task's own options set of the model (Task.head_options: STS's similarity_objective, ...),
                  which the task reads: the model holds them (task_options) and saves them with its own options

What a head reads (the pooled sequence, u and v, through the dense layer and dropout) is model.readout's
(readout.py), which the tasks call. The heads as the tasks build them: sst dropout + linear on the pooled
sentence -> 5 logits; qqp a linear head on [u, v, |u - v|] (cross: on the pooled pair) -> 1 logit; sts cos(u, v)
(cross: a linear head -> 1 logit); qa a linear head on every token's last hidden state -> start and end logits
(B, T, 2), padding masked. Losses, scores and decisions are the tasks' objectives (losses.py).

SMART perturbs the embedding output (and LNSR the encoder's layers), so the forward pass also comes in parts:

    model.set_adapter(task)                          # the task's own adapters, if it has them (as peft's)
    inputs = model.encoder_inputs(task, batch)       # the (B, T) or, for SBERT pairs, (2B, T) encoder batch
    embeddings = model.embed(inputs)                 # (B, T, H) or (2B, T, H)
    outputs = model.outputs_from_embeddings(task, embeddings, inputs)

forward() does all of it. Which adapters run is the model's state, which set_adapter sets (encoder_inputs has no
side effect); a task's head refuses an encoding made with another task's adapters, so a forgotten set_adapter
fails instead of mixing tasks.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from base_bert import BertConfig, CheckpointError
from bert import BertModel, TokenLayout
from minbert.model.adapters import SHARED_SET, AdapterConfig, activate, add_adapters
from minbert.model.checkpoint import atomic_save, check_fields, read_checkpoint
from minbert.model.readout import POOLINGS, Readout
from minbert.tasks import MULTITASK, PAIR_TASKS, RUN_TASKS, TASKS, head_options, task_name

PAIR_ENCODERS = ("sbert", "cross", "hybrid")
HEAD_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


def parse_pair_encoders(choice: str | dict) -> dict[str, str]:
    """'cross' (every pair task) or 'qqp:cross,sts:hybrid' (per task, the others sbert) -> {qqp: .., sts: ..}."""
    if isinstance(choice, dict):
        encoders = dict(choice)
    elif ":" not in choice:
        encoders = dict.fromkeys(PAIR_TASKS, choice.strip())
    else:
        encoders = dict.fromkeys(PAIR_TASKS, "sbert")
        for item in filter(None, (part.strip() for part in choice.split(","))):
            name, _, encoder = (part.strip() for part in item.partition(":"))
            try:
                task = task_name(name)
            except ValueError:
                task = None
            if task not in PAIR_TASKS:
                raise ValueError(f"pair encoder {item!r}: write TASK:ENCODER with TASK one of {', '.join(PAIR_TASKS)}")
            encoders[task] = encoder
    if sorted(encoders) != sorted(PAIR_TASKS) or not set(encoders.values()) <= set(PAIR_ENCODERS):
        raise ValueError(f"pair encoder must be one of {PAIR_ENCODERS}, for all pair tasks or per task "
                         f"(e.g. qqp:cross,sts:hybrid), got {choice!r}")
    return encoders


def pad_to(ids: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(ids, (0, length - ids.shape[1]))  # pad id, mask and segment are all 0


def join_pairs(batch: dict) -> dict:
    """The joint [CLS] s1 [SEP] s2 [SEP] batch (segment ids 0 / 1) built from separately tokenised sides
    (keys *_1 / *_2, each [CLS] s [SEP]): for the course's prediction API on a joint pair encoder."""
    lengths_1, lengths_2 = batch["attention_mask_1"].sum(1).tolist(), batch["attention_mask_2"].sum(1).tolist()
    length = max(a + b - 1 for a, b in zip(lengths_1, lengths_2))
    ids = batch["input_ids_1"].new_zeros(len(lengths_1), length)  # (B, T)
    segments, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, (a, b) in enumerate(zip(lengths_1, lengths_2)):
        ids[row, :a] = batch["input_ids_1"][row, :a]
        ids[row, a:a + b - 1] = batch["input_ids_2"][row, 1:b]  # the second side's [CLS] dropped
        segments[row, a:a + b - 1] = 1
        mask[row, :a + b - 1] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


class EncoderInputs(NamedTuple):
    input_ids: torch.Tensor  # (B, T) or (2B, T)
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    layout: TokenLayout  # built once for every encoder pass of the batch (SMART's, LNSR's, the clean one)


class MultitaskBERT(nn.Module):
    """Shared minBERT with Sentence-BERT heads (see the module docstring)."""

    def __init__(self, bert: BertModel, pooling: str = "mean", dropout: float = 0.1,
                 pair_encoder: str | dict = "sbert", *, head_hidden: int = 0, head_activation: str = "tanh",
                 adapter: AdapterConfig | dict | None = None, tasks: tuple[str, ...] | list[str] = MULTITASK,
                 **task_options):
        """`tasks`: those the model has heads (and per-task adapters) for, some of RUN_TASKS. `task_options`: what
        the tasks' own options set of the model (tasks.head_options: STS's similarity_objective, ...), each task's
        default where absent."""
        super().__init__()
        if not tasks or not set(tasks) <= set(RUN_TASKS):
            raise ValueError(f"tasks must be some of {RUN_TASKS}, got {tasks!r}")
        self.tasks = tuple(task for task in RUN_TASKS if task in tasks)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if head_activation not in HEAD_ACTIVATIONS or head_hidden < 0:
            raise ValueError(f"head_hidden must be >= 0 and head_activation one of {tuple(HEAD_ACTIVATIONS)}")
        defaults = head_options({})
        unknown = sorted(set(task_options) - set(defaults))
        if unknown:
            raise ValueError(f"no task has the option {unknown[0]!r} (the tasks' are {', '.join(defaults)})")
        hidden = bert.config.hidden_size
        self.bert = bert
        self.pair_encoders = parse_pair_encoders(pair_encoder)
        self.head_hidden, self.head_activation = head_hidden, head_activation
        self.task_options = defaults | task_options
        options = {"pair_encoder": self.pair_encoders, **self.task_options}
        for task in RUN_TASKS:
            TASKS[task].model.check_options(options)
        self.objectives = {task: TASKS[task].model.objective(options) for task in RUN_TASKS}
        self.dropout = nn.Dropout(dropout)
        self.add_heads(hidden, dropout)
        dense_heads = self.dense_heads if self.head_hidden else None
        self.readout = Readout(pooling, self.pair_encoders, dense_heads, self.dropout)  # applies, holds no weights
        self.adapter = AdapterConfig(**adapter) if isinstance(adapter, dict) else adapter
        self.adapter_task: str | None = None  # whose per-task adapters run (set_adapter); None: the base model's
        if self.adapter is not None:
            pals = add_adapters(bert, self.adapter, self.tasks if self.has_task_adapters() else [SHARED_SET])
            if pals is not None:
                self.pals = pals
            activate(self, None if self.has_task_adapters() else SHARED_SET)  # per task: set_adapter chooses

    def add_heads(self, hidden: int, dropout: float) -> None:
        """Each task's dense layer (head_hidden > 0) and linear head, created (and their weights drawn) in the
        tasks' order: the dense layers, then the heads."""
        features = {task: TASKS[task].model.feature_size(self.pair_encoders, hidden) for task in self.tasks}
        features = {task: size for task, size in features.items() if size is not None}
        if self.head_hidden:
            self.dense_heads = nn.ModuleDict({
                task: nn.Sequential(nn.Linear(size, self.head_hidden), HEAD_ACTIVATIONS[self.head_activation](),
                                    nn.Dropout(dropout))
                for task, size in features.items()})
            features = dict.fromkeys(features, self.head_hidden)
        for task in self.tasks:
            if self.has_linear_head(task):  # a head without features of its own reads every hidden state (SQuAD's)
                name = TASKS[task].head_name
                if hasattr(self, name):  # setattr would silently replace the model's own module or method
                    raise ValueError(f"task {task!r}: its head_name {name!r} is already an attribute of "
                                     "MultitaskBERT; name the head something else in its task module")
                setattr(self, name, TASKS[task].model.build_head(features.get(task, hidden)))

    def head_options(self) -> dict:
        """What rebuilds the model's heads (a checkpoint's "heads": MultitaskBERT(bert, **head_options())), the tasks'
        options under the keys they have always been saved under."""
        return {"pooling": self.readout.pooling, "dropout": self.dropout.p, "pair_encoder": self.pair_encoders,
                "head_hidden": self.head_hidden, "head_activation": self.head_activation,
                "adapter": None if self.adapter is None else dataclasses.asdict(self.adapter),
                "tasks": list(self.tasks), **self.task_options}

    def has_task_adapters(self) -> bool:
        """Whether each task has adapters of its own, switched by set_adapter (shared ones always run)."""
        return self.adapter is not None and self.adapter.sharing == "per_task"

    def has_linear_head(self, task: str) -> bool:
        """Whether the task's output comes from a linear head (the task says: every task's but an SBERT or hybrid STS,
        whose output is the cosine of u and v)."""
        return TASKS[task].model.has_head(self.pair_encoders)

    def trains_with_frozen_encoder(self, task: str) -> bool:
        """Whether the task has weights beside BERT's own (adapters, a dense head, a linear head): with BERT frozen
        (--option pretrain) an STS cosine without them has nothing to train."""
        return self.adapter is not None or self.head_hidden > 0 or self.has_linear_head(task)

    def reads_pairs_jointly(self, task: str) -> bool:
        """Whether this task's batches hold each pair as one sequence (collate with cross_encoder=True)."""
        return self.pair_encoders.get(task, "sbert") != "sbert"

    def is_shared(self, parameter_name: str) -> bool:
        """Whether a parameter serves every task (the encoder, shared adapters) rather than one task's
        head or adapters."""
        if ".adapters." in parameter_name or parameter_name.startswith("pals."):
            return f".{SHARED_SET}." in parameter_name
        return parameter_name.startswith("bert.")

    def encode_sentences(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        hidden = self.bert.encode(self.bert.embed(input_ids, token_type_ids), attention_mask)
        return self.readout.pool(hidden, attention_mask)  # (B, H)

    def set_adapter(self, task: str) -> None:
        """Run the next encoder passes through the task's own adapters, as peft's set_adapter does (nothing to do
        without per-task ones). forward() sets its task's; code that runs a task in parts (SMART, LNSR, sentence
        embeddings) calls it first."""
        if self.has_task_adapters():
            activate(self, task)
            self.adapter_task = task

    def encoder_inputs(self, task: str, batch: dict) -> EncoderInputs:
        """What the encoder reads for this task (no side effect: set_adapter chooses the adapters): SBERT pairs
        become both sides as one (2B, T) batch, one encoder pass instead of two.
        The batch's `lengths` (datasets' and squad's collates put the rows' real-token counts there, on the host)
        let the layout be built without reading the mask back from the device."""
        if self.reads_pairs_jointly(task) and "input_ids" not in batch:
            batch = join_pairs(batch)
        if self.pair_encoders.get(task) != "sbert":  # a sentence, or a pair as one sequence
            mask = batch["attention_mask"]
            return EncoderInputs(batch["input_ids"], mask, batch.get("token_type_ids"),
                                 self.bert.encoder.layout(mask, batch.get("lengths")))
        length = max(batch["input_ids_1"].shape[1], batch["input_ids_2"].shape[1])
        ids = torch.cat([pad_to(batch["input_ids_1"], length), pad_to(batch["input_ids_2"], length)])
        mask = torch.cat([pad_to(batch["attention_mask_1"], length), pad_to(batch["attention_mask_2"], length)])
        lengths = (np.concatenate([batch["lengths_1"], batch["lengths_2"]])
                   if "lengths_1" in batch and "lengths_2" in batch else None)
        return EncoderInputs(ids, mask, None, self.bert.encoder.layout(mask, lengths))  # (2B, T) each

    def embed(self, inputs: EncoderInputs) -> torch.Tensor:
        return self.bert.embed(inputs.input_ids, inputs.token_type_ids)  # (B, T, H) or (2B, T, H)

    def outputs_from_embeddings(self, task: str, embeddings: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        return self.outputs_from_hidden(task, self.bert.encode(embeddings, inputs.attention_mask, inputs.layout),
                                        inputs)

    def outputs_from_hidden(self, task: str, hidden: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        """The task's outputs from the encoder's last hidden states (B, T, H) or (2B, T, H)."""
        if self.has_task_adapters() and self.adapter_task != task:
            raise RuntimeError(f"{task}'s head on an encoding made with {self.adapter_task or 'no task'}'s adapters: "
                               f"call set_adapter({task!r}) before running {task} in parts")
        return TASKS[task].model.outputs(self, hidden, inputs)

    def forward(self, task: str, batch: dict) -> torch.Tensor:
        self.set_adapter(task)  # a whole pass (predictions, SMART's anchor) always runs its task's adapters
        inputs = self.encoder_inputs(task, batch)
        return self.outputs_from_embeddings(task, self.embed(inputs), inputs)

    def score(self, task: str, batch: dict) -> torch.Tensor:
        """What a run saves for ensembles: SST's 5 logits, QQP's logit, STS's 0-5 similarity (its objective's)."""
        return self.objectives[task].score(self(task, batch))

    def predict(self, task: str, batch: dict) -> torch.Tensor:
        """The task's prediction: SST class, QQP 0/1, STS score on 0-5."""
        return self.objectives[task].decide(self.score(task, batch))

    # The course's prediction API.
    def predict_sentiment(self, input_ids, attention_mask):
        return self("sst", {"input_ids": input_ids, "attention_mask": attention_mask})

    def predict_paraphrase(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        return self("qqp", {"input_ids_1": input_ids_1, "attention_mask_1": attention_mask_1,
                            "input_ids_2": input_ids_2, "attention_mask_2": attention_mask_2})

    def predict_similarity(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        return self.predict("sts", {"input_ids_1": input_ids_1, "attention_mask_1": attention_mask_1,
                                    "input_ids_2": input_ids_2, "attention_mask_2": attention_mask_2})


def model_metadata(model: nn.Module) -> dict:
    """What rebuilds the model: the BERT config and the head options; for adapters over a frozen BERT also
    the base model's identity and a hash of its weights (the checkpoint then holds only what trained)."""
    metadata = {"bert_config": model.bert.config.to_dict(), "heads": model.head_options()}
    if holds_trained_only(model):
        metadata["base"] = {"pretrained": getattr(model.bert, "name_or_path", None),
                            "sha256": base_fingerprint(model.bert)}
    return metadata


def holds_trained_only(model: nn.Module) -> bool:
    """Adapters over a (partly) frozen BERT: checkpoints keep the trainable tensors only."""
    return getattr(model, "adapter", None) is not None and not all(p.requires_grad for p in model.parameters())


def base_fingerprint(bert: BertModel) -> str:
    """SHA-256 of the base BERT's weights, adapters left out, under a plain BertModel's names."""
    digest = hashlib.sha256()
    for key, value in sorted(bert.state_dict().items()):
        if ".adapters." not in key:
            digest.update(key.replace(".base_layer.", ".").encode())
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def trained_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint keeps: every one, or only the trainable ones (see holds_trained_only)."""
    if holds_trained_only(model):
        return {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


def load_trained_tensors(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Load what trained_tensors saved: all tensors, or exactly the trainable ones."""
    if not holds_trained_only(model):
        model.load_state_dict(tensors)
        return
    expected = {name for name, p in model.named_parameters() if p.requires_grad}
    if set(tensors) != expected:
        missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise KeyError(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.load_state_dict(tensors, strict=False)


def save_multitask_model(model: MultitaskBERT, prefix: Path, metadata: dict) -> None:
    atomic_save(prefix, trained_tensors(model), {**model_metadata(model), **metadata})


def freeze_encoder(model: MultitaskBERT) -> None:
    """--option pretrain: BERT's own weights stop training; adapters (inside it or beside it) and heads train."""
    for name, parameter in model.bert.named_parameters():
        if ".adapters." not in name:
            parameter.requires_grad = False


def _base_bert(prefix: Path, metadata: dict) -> BertModel:
    """The base BERT of an adapter checkpoint, rebuilt from its pretrained source and checked by hash."""
    base = metadata["base"]
    bert = BertModel(BertConfig.from_dict(metadata["bert_config"]))
    bert.load_state_dict(BertModel.from_pretrained(base["pretrained"]).state_dict())
    bert.name_or_path = base["pretrained"]
    if base_fingerprint(bert) != base["sha256"]:
        raise CheckpointError(f"{prefix}: its adapters were trained on other base weights than those of "
                              f"{base['pretrained']} now (SHA-256 differs); load it with that base model")
    return bert


def load_multitask_model(prefix: str | Path, device: torch.device | str = "cpu") -> MultitaskBERT:
    """Rebuild a MultitaskBERT from PREFIX.safetensors + PREFIX.json (no pretrained download needed, except
    for the base model of an adapter-only checkpoint, which is checked against the hash it was trained on)."""
    return load_multitask_checkpoint(prefix, device)[0]


def load_multitask_checkpoint(prefix: str | Path, device: torch.device | str = "cpu") -> tuple[MultitaskBERT, dict]:
    """load_multitask_model's model and the checkpoint's metadata (its args, metrics, base), read once."""
    tensors, metadata = read_checkpoint(Path(prefix))
    if "next_stage" in metadata:  # training_state.py's OUTPUT_DIR/last: the optimizer's state beside the model's
        raise CheckpointError(f"{prefix}: a run's training state, which --resume continues; the model a run keeps is "
                              "OUTPUT_DIR/best (each stage's, with --keep_stage_models: OUTPUT_DIR/stage_N)")
    check_fields(Path(prefix).with_suffix(".json"), metadata, {"bert_config": dict, "heads": dict})
    try:
        if "base" in metadata:
            bert = _base_bert(Path(prefix), metadata)
        else:
            bert = BertModel(BertConfig.from_dict(metadata["bert_config"]))
        model = MultitaskBERT(bert, **metadata["heads"])
        if "base" in metadata:
            freeze_encoder(model)
        load_trained_tensors(model, tensors)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{prefix}: checkpoint does not describe a MultitaskBERT "
                              f"({type(err).__name__}: {err})") from None
    return model.to(device), metadata
