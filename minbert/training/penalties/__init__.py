"""Penalties that are one file each: every module of this folder that defines PENALTY (an objective.PenaltyKind) is
found when the package is imported, its flags become multitask_classifier.py's (training_args), and a run whose
flags turn it on adds its Penalty to every task's objective after the built-in ones (run_setup.build_penalties).
A new regulariser is a new file here and nothing else (docs/layout.md, "Adding a regulariser")."""
from __future__ import annotations

import importlib
import pkgutil

from minbert.files import refused_at_import
from minbert.training.objective import PenaltyKind


def _discover() -> tuple[dict[str, PenaltyKind], dict[str, str]]:
    """Every module's PENALTY by name, in the modules' alphabetical order, and each one's file; a PENALTY that is no PenaltyKind, or a name
    or flag that two modules claim, is a ValueError naming both files."""
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
