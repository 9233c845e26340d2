"""Finished runs' kept models as the members of one ensemble (scripts/robustness.py), checked against each other from
their checkpoints' JSON and their tokenizers before any weights load: every member has the tasks asked, and several
members share the first one's max_length, hidden size and tokenizer vocabulary, so that one text is one sequence of
token ids, and one perturbation of the input embeddings fits every member.

    prefixes, tasks = check_members(["runs/a", "runs/b"], None)   # CheckpointError: one line naming the run
    scored, first = load_scored(prefixes, ["runs/a", "runs/b"], device, None, tasks)   # what the suite scores
"""
from __future__ import annotations

import json
from pathlib import Path

from base_bert import CheckpointError
import torch

from minbert.model.multitask_bert import MultitaskBERT, load_multitask_checkpoint
from minbert.prediction.inference import Predictor
from minbert.robustness.ensemble_predictor import EnsemblePredictor, RunPredictor
from minbert.run.kept_model import checkpoint_prefix, kept_predictor, kept_tokenizer
from minbert.tasks import MULTITASK, TEXT_TASKS


def checkpoint_json(prefix: Path) -> dict:
    """The checkpoint's settings (PREFIX.json) without its weights; {} when unreadable (loading it says why)."""
    try:
        metadata = json.loads(prefix.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def model_tasks(metadata: dict) -> list[str]:
    """The tasks a checkpoint has heads for (every task of the course's when its JSON does not say)."""
    heads = metadata.get("heads")
    return list(heads.get("tasks", MULTITASK)) if isinstance(heads, dict) else list(MULTITASK)


def shape_of(metadata: dict) -> dict[str, object]:
    """What members must share to read one text alike, by what to call it in an error."""
    settings = metadata.get("args") if isinstance(metadata.get("args"), dict) else {}
    config = metadata.get("bert_config") if isinstance(metadata.get("bert_config"), dict) else {}
    return {"max_length": settings.get("max_length"), "hidden size": config.get("hidden_size")}


def check_members(runs: list[str], asked: list[str] | None) -> tuple[list[Path], list[str]]:
    """The runs' kept-model prefixes and the tasks to score (`asked`, else the first run's sentence tasks), checked:
    every run has a head for each task, and each run after the first is another model (not the same checkpoint
    again) with the first's max_length, hidden size and tokenizer vocabulary. CheckpointError otherwise."""
    prefixes = [checkpoint_prefix(run) for run in runs]
    metadata = [checkpoint_json(prefix) for prefix in prefixes]
    tasks = asked or [task for task in TEXT_TASKS if task in model_tasks(metadata[0])]
    for prefix, settings in zip(prefixes, metadata):
        has = model_tasks(settings)
        lacking = [task for task in tasks if task not in has]
        if lacking or not tasks:
            raise CheckpointError(f"{prefix}: the model has no {', '.join(lacking) or 'sentence task'} head "
                                  f"(it has {', '.join(has)})")
    first = shape_of(metadata[0])
    for index, (run, prefix, settings) in enumerate(zip(runs, prefixes, metadata)):
        earlier = [other for other, seen in zip(runs, prefixes[:index]) if seen.resolve() == prefix.resolve()]
        if earlier:
            raise CheckpointError(f"{run}: the same kept model as {earlier[0]}; give each member once")
        differing = [f"{name} {value} (the first run's: {first[name]})"
                     for name, value in shape_of(settings).items() if value != first[name]]
        if index and differing:
            raise CheckpointError(f"{run}: its {', '.join(differing)}; an ensemble's members must read one text alike")
    if len(runs) > 1:
        vocabulary = kept_tokenizer(prefixes[0], metadata[0]).backend.get_vocab()
        for run, prefix, settings in zip(runs[1:], prefixes[1:], metadata[1:]):
            if kept_tokenizer(prefix, settings).backend.get_vocab() != vocabulary:
                raise CheckpointError(f"{run}: its tokenizer's vocabulary is not the first run's ({runs[0]}); an "
                                      "ensemble's members must read one text as the same token ids")
    return prefixes, tasks


def check_pair_reading(models: list[MultitaskBERT], runs: list[str], tasks: list[str]) -> None:
    """CheckpointError when a member reads a pair task's two sentences otherwise than the first (one sequence, or
    two as SBERT does): the embedding attack adds one perturbation to every member's embeddings of the same tokens."""
    for task in tasks:
        for model, run in zip(models[1:], runs[1:]):
            if model.reads_pairs_jointly(task) != models[0].reads_pairs_jointly(task):
                how = {True: "as one sequence", False: "as two (SBERT)"}
                raise CheckpointError(f"{run}: reads {task}'s pairs {how[model.reads_pairs_jointly(task)]}, the first "
                                      f"run ({runs[0]}) {how[models[0].reads_pairs_jointly(task)]}; the embedding "
                                      "attack needs them alike (--families without embedding scores the rest)")


def load_scored(prefixes: list[Path], runs: list[str], device: torch.device, batch_size: int | None,
                attacked_tasks: list[str]) -> tuple[RunPredictor | EnsemblePredictor, Predictor]:
    """What the robustness suite scores, one run's model (RunPredictor) or the runs' ensemble (EnsemblePredictor),
    each member predicting as its run did (kept_predictor, `batch_size` if given), and the first run's Predictor;
    the members' pair reading checked for the tasks the embedding attack will run on (`attacked_tasks`)."""
    models, predictors = [], []
    for prefix in prefixes:
        model, metadata = load_multitask_checkpoint(prefix, device)
        models.append(model)
        predictors.append(kept_predictor(model, prefix, metadata, device, batch_size))
    check_pair_reading(models, runs, attacked_tasks)
    return (RunPredictor(predictors[0]) if len(predictors) == 1 else EnsemblePredictor(predictors)), predictors[0]
