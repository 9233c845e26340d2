"""LNSR (Hua et al. 2021; the algorithm and its settings are minbert/training/lnsr.py's) as the run's penalty: its
flags (--lnsr on --lnsr_tasks, the weight, the layer b and the noise), their checks (the layer against the model's
depth once its config.json is read, before its weights load) and the penalty on the run's task losses (LnsrPenalty:
its clean pass is the task's forward)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from minbert.training.lnsr import LnsrConfig, encode_with_noise_stability
from minbert.training.objective import Penalty, PenaltyFlag, PenaltyKind, TaskForward
from minbert.training.penalties.task_flags import named_tasks


@dataclass
class LnsrPenalty(Penalty):
    """LNSR on the tasks of `configs` (a config each), as "lnsr": its clean pass is the task's forward."""
    configs: dict[str, LnsrConfig]
    name = "lnsr"

    def applies_to(self, task: str) -> bool:
        return task in self.configs

    def encode(self, forward: TaskForward) -> Tensor:
        inputs = forward.inputs
        hidden, forward.pending["lnsr"] = encode_with_noise_stability(
            forward.model.bert.encoder, forward.embeddings, inputs.attention_mask, self.configs[forward.task],
            inputs.layout)
        return hidden

    def terms(self, forward: TaskForward) -> dict[str, Tensor]:
        return {"lnsr": forward.pending["lnsr"]}


def lnsr_tasks(settings) -> tuple[str, ...]:
    """The tasks --lnsr regularises (none without --lnsr)."""
    return named_tasks(settings.lnsr_tasks) if settings.lnsr else ()


def lnsr_config(settings, num_layers: int | None) -> LnsrConfig:
    """LNSR's settings; the default layer b is L - 2 of the model's L layers (checked once L is known)."""
    layer = settings.lnsr_layer if settings.lnsr_layer is not None else max(0, (num_layers or 2) - 2)
    if num_layers is not None and layer >= num_layers:
        raise ValueError(f"--lnsr_layer {layer} leaves no layer to measure in a {num_layers}-layer encoder; "
                         f"use 0..{num_layers - 1}")
    return LnsrConfig(settings.lnsr_weight, layer, settings.lnsr_noise_std)


def check(settings) -> None:
    if settings.lnsr:
        lnsr_config(settings, num_layers=None)  # LnsrConfig checks the weight, the noise and the layer


def check_model(settings, config) -> None:
    if settings.lnsr:
        lnsr_config(settings, config.num_hidden_layers)


def build(settings, model) -> LnsrPenalty | None:
    tasks = lnsr_tasks(settings)
    return LnsrPenalty({task: lnsr_config(settings, settings.num_layers) for task in tasks}) if tasks else None


PENALTY = PenaltyKind(
    name="lnsr", title="LNSR, layer-wise noise stability (Hua et al. 2021); defaults are AllBERT's for STS",
    switch="lnsr", early=True, after="smart_override", build=build, check=check, check_model=check_model, flags={
        "lnsr": PenaltyFlag(False, "regularise the tasks in --lnsr_tasks", type=None, action="store_true"),
        "lnsr_tasks": PenaltyFlag("sts", None, type=None, tasks="list"),
        "lnsr_weight": PenaltyFlag(0.005, "lambda"),
        "lnsr_layer": PenaltyFlag(None, "b: noise added to this layer's output (0: the embeddings), later layers "
                                  "measured (default: L - 2, AllBERT's 10 of 12)", type=int),
        "lnsr_noise_std": PenaltyFlag(LnsrConfig.noise_std, "sigma (AllBERT: sigma^2 = 1e-5)")})
