"""The run's penalties. Those that are one file each: every module of this folder that defines PENALTY (an
objective.PenaltyKind) is found when the package is imported, its flags become multitask_classifier.py's
(training_args), and a run whose flags turn it on adds its Penalty to every task's objective after the built-in ones
(distillation, LNSR, SMART), in the files' alphabetical order (build_penalties). EWC (ewc.py) and L2-SP (l2sp.py) are
such files. A new regulariser is a new file here and nothing else (docs/layout.md, "Adding a regulariser").

    penalties = build_penalties(PenaltySettings(...), model, teacher)    # run_settings.penalty_settings makes them
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import SimpleNamespace

from minbert.files import refused_at_import
from minbert.model.multitask_bert import MultitaskBERT
from minbert.training.distillation import Distillation, TeacherScores, TeacherSpans
from minbert.training.lnsr import LnsrConfig, LnsrPenalty
from minbert.training.objective import Penalty, PenaltyKind
from minbert.training.regularization import SmartPenalty
from smart import BregmanAnchor, SmartConfig, SmartRegularizer, bregman_momentum


def _discover() -> tuple[dict[str, PenaltyKind], dict[str, str]]:
    """Every module's PENALTY by name, in the modules' alphabetical order, and each one's file; a PENALTY that is no
    PenaltyKind, or a name or flag that two modules claim, is a ValueError naming both files."""
    kinds, files, owners = {}, {}, {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        if not hasattr(loaded, "PENALTY"):
            continue
        file, kind = f"minbert/training/penalties/{module.name}.py", loaded.PENALTY
        if not isinstance(kind, PenaltyKind):
            raise ValueError(f"{file}: PENALTY must be a minbert.training.objective.PenaltyKind, "
                             f"not {type(kind).__name__}")
        if kind.name in files:
            raise ValueError(f"{file}: its penalty name {kind.name!r} is already {files[kind.name]}'s")
        for flag in kind.flags:
            if flag in owners:
                raise ValueError(f"{file}: its flag '--{flag}' is already {owners[flag]}'s")
            owners[flag] = file
        kinds[kind.name], files[kind.name] = kind, file
    return kinds, files


PENALTY_KINDS: dict[str, PenaltyKind]
PENALTY_FILES: dict[str, str]  # for messages: 'toy' -> 'minbert/training/penalties/toy.py'
with refused_at_import(ValueError):
    PENALTY_KINDS, PENALTY_FILES = _discover()


@dataclass(frozen=True)
class SmartSettings:
    """SMART on its tasks: each one's config (the global flags, then --smart_override), and the Bregman anchor they
    share (smart.BregmanAnchor: a fixed momentum or None for SMART's schedule, what the schedule's 10% is of, and
    what the anchor is: smart.ANCHORS)."""
    configs: dict[str, SmartConfig]
    momentum: float | None
    momentum_schedule: str
    anchor: str


@dataclass(frozen=True)
class PenaltySettings:
    """Every penalty of the tasks' losses as the run's flags set it: distillation per task (the weight and temperature
    of each task with a teacher, and the global ones), LNSR per task, SMART (None: off), and the flags of each
    penalty of this folder (EWC, L2-SP, ...), by its name."""
    distillation: dict[str, tuple[float, float]]
    distill_weight: float
    distill_temperature: float
    lnsr: dict[str, LnsrConfig]
    smart: SmartSettings | None
    kinds: dict[str, SimpleNamespace]


def build_penalties(settings: PenaltySettings, model: MultitaskBERT,
                    teacher: dict[str, TeacherScores | TeacherSpans] | None = None) -> list[Penalty]:
    """The penalties of the run's task losses, in the order each task's objective applies them: distillation from
    --distill's `teacher` scores, LNSR, SMART, then those of this folder that their flags turn on, in their files'
    alphabetical order (ewc.py before l2sp.py). Each is built on the model as it is: the pretrained weights, before a
    resume loads the run's (L2-SP's anchor)."""
    penalties = []
    if teacher:
        penalties.append(Distillation(teacher, settings.distill_weight, settings.distill_temperature,
                                      settings.distillation))
    if settings.lnsr:
        penalties.append(LnsrPenalty(settings.lnsr))
    if settings.smart is not None:
        penalties.append(smart_penalty(settings.smart, model))
    built = (kind.build(settings.kinds[name], model) for name, kind in PENALTY_KINDS.items())
    return penalties + [penalty for penalty in built if penalty is not None]


def smart_penalty(settings: SmartSettings, model: MultitaskBERT) -> SmartPenalty:
    """SMART's regularizers of its tasks, one Bregman anchor shared by every task that needs one."""
    anchor = None
    if any(config.bregman_weight > 0 for config in settings.configs.values()):
        anchor = BregmanAnchor(model, bregman_momentum(0, 1, settings.momentum))
    return SmartPenalty({task: SmartRegularizer(model, config, anchor) for task, config in settings.configs.items()},
                        anchor, settings.momentum, settings.momentum_schedule, settings.anchor)
