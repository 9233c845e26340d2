"""A finished run's kept model, as predict.py and scripts/robustness.py read it: the checkpoint a run's folder keeps
(OUTPUT_DIR/best) or a checkpoint prefix, and a Predictor that predicts as the run did.

    prefix = checkpoint_prefix("runs/demo")                       # runs/demo/best; CheckpointError when absent
    model, metadata = load_multitask_checkpoint(prefix, device)
    predictor = kept_predictor(model, prefix, metadata, device)   # the run's tokenizer, --max_length, batch size
"""
from __future__ import annotations

from pathlib import Path

import torch

from base_bert import CheckpointError
from minbert.data.batches import TokenizedSplits
from minbert.model.multitask_bert import MultitaskBERT
from minbert.prediction.inference import PredictionSettings, Predictor
from minbert.run.run_record import recorded_pretrained
from minbert.runtime import resolve_precision
from minbert.tasks import task_settings
from tokenizer import BertTokenizer

KEPT_MODEL = "best"


def checkpoint_prefix(run: str | Path) -> Path:
    """The kept model of a run's folder, or the checkpoint prefix given; CheckpointError when neither is there."""
    path = Path(run)
    if path.is_dir():
        prefix = path / KEPT_MODEL
    else:  # PREFIX, or one of its two files named
        prefix = path.with_suffix("") if path.suffix in (".json", ".safetensors") else path
    if not (prefix.with_suffix(".json").is_file() and prefix.with_suffix(".safetensors").is_file()):
        where = f"{run}: no kept model ({KEPT_MODEL}.json and {KEPT_MODEL}.safetensors)" if path.is_dir() else (
            f"{run}: neither a run's folder nor a checkpoint (PREFIX.json and PREFIX.safetensors)")
        raise CheckpointError(f"{where}; a run keeps its model once a stage has been evaluated")
    return prefix


def kept_tokenizer(prefix: Path, metadata: dict) -> BertTokenizer:
    """The run's tokenizer: its --pretrained's (a relative path read where the run started)."""
    return BertTokenizer.from_pretrained(recorded_pretrained(prefix, metadata) or metadata["args"]["pretrained"])


def kept_predictor(model: MultitaskBERT, prefix: Path, metadata: dict, device: torch.device,
                   batch_size: int | None = None, precision: str | None = None, quiet: bool = True) -> Predictor:
    """A Predictor as the run's own: its tokenizer, --max_length, --eval_batch_size (or `batch_size`), precision
    (or `precision`, resolved on `device`) and the tasks' own options (SQuAD's windows and answer limits; a record
    older than an option: its default)."""
    settings = metadata.get("args", {})
    requested = precision or settings.get("precision", "auto")
    prediction = PredictionSettings(batch_size or settings["eval_batch_size"], settings["max_length"],
                                    resolve_precision(device, requested), quiet)
    splits = TokenizedSplits(kept_tokenizer(prefix, metadata), model, settings["max_length"], task_settings(settings))
    return Predictor(model, splits, device, prediction)


def missing_head(model: MultitaskBERT, prefix: Path, task: str) -> CheckpointError | None:
    """The error for a task the model has no head for, or None."""
    if task in model.tasks:
        return None
    return CheckpointError(f"{prefix}: the model has no {task} head (it has {', '.join(model.tasks)})")
