"""The run's penalties, each one file of this folder: every module here that defines PENALTY (an
objective.PenaltyKind) is found when the package is imported, its flags become multitask_classifier.py's
(training_args), and a run whose flags turn it on adds its Penalty to every task's objective: the early ones first
(distillation.py, lnsr.py, smart.py: the course's regularisers, as they always came), then the others (EWC: ewc.py,
L2-SP: l2sp.py, ...), each in the files' alphabetical order (build_penalties). A new regulariser is a new file here
and nothing else (docs/layout.md, "Adding a regulariser"); task_flags.py, no penalty, reads the flags that name
tasks.

    penalties = build_penalties(PenaltySettings(...), model, inputs)    # run_settings.penalty_settings makes them
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import SimpleNamespace

from minbert.files import refused_at_import
from minbert.model.multitask_bert import MultitaskBERT
from minbert.training.objective import Penalty, PenaltyKind


def _discover() -> tuple[dict[str, PenaltyKind], dict[str, str]]:
    """Every module's PENALTY by name, the early ones first, each group in the modules' alphabetical order, and each
    one's file; a PENALTY that is no PenaltyKind, or a name or flag that two modules claim, is a ValueError naming
    both files."""
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
    order = sorted(kinds, key=lambda name: not kinds[name].early)  # stable: alphabetical within each group
    return {name: kinds[name] for name in order}, files


PENALTY_KINDS: dict[str, PenaltyKind]
PENALTY_FILES: dict[str, str]  # for messages: 'toy' -> 'minbert/training/penalties/toy.py'
with refused_at_import(ValueError):
    PENALTY_KINDS, PENALTY_FILES = _discover()


@dataclass(frozen=True)
class PenaltySettings:
    """Each penalty's settings by its name, as the run's flags set them: its flags' values under their names, the
    run's `tasks` (comma-separated, as --tasks names them) and the model's `num_layers`."""
    kinds: dict[str, SimpleNamespace]


def build_penalties(settings: PenaltySettings, model: MultitaskBERT, inputs: dict[str, object] | None = None
                    ) -> list[Penalty]:
    """The penalties of the run's task losses that their flags turn on, in the order each task's objective applies
    them (PENALTY_KINDS': distillation, LNSR, SMART, then ewc.py, l2sp.py, ...); `inputs`: what each penalty's
    `load` read before the model loaded (--distill's teacher scores), by its name. Each is built on the model as it
    is: the pretrained weights, before a resume loads the run's (L2-SP's anchor)."""
    inputs = inputs or {}
    built = (kind.build(SimpleNamespace(**vars(settings.kinds[name]), inputs=inputs.get(name)), model)
             for name, kind in PENALTY_KINDS.items())
    return [penalty for penalty in built if penalty is not None]
