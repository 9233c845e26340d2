"""A run's own recipe, OUTPUT_DIR/args.json: the settings it was started with, what they resolved to on its machine,
the code it ran (git commit) and the software and hardware it ran on.

    {"args": {...},           # every setting by its field name (training_args.TrainingArguments): what --config reads
     "resolved": {...},       # what "auto" and the device made of them: precision, device, processes; and
                              # working_dir, what the settings' relative paths are relative to
     "git": {"commit": "...", "dirty": false},   # null outside a git checkout or without git
     "environment": {"python": ..., "torch": ..., "cuda": ..., "gpus": [...]},
     "segments": [{"first_stage": 1, "resolved": {...}}, ...]}

"args" and "resolved" are those of the run's last start or --resume. A resume refuses every setting that would
change what the run trains (training_args.check_resume_arguments), but what "auto" resolves to follows the machine
(an L4's bf16, a T4's fp16), so "segments" record what every part of the run resolved to and the stage it began or
continued at. --config refuses a record whose segments resolved differently, unless the command line decides that
setting: a run trains every stage one way.

`python multitask_classifier.py --config RUN/args.json --output_dir OTHER` trains the run again. A record derived
from an older run's best.json (scripts/write_args_json.py) has "derived_from" and null for what was not saved then;
the settings it lacks (added to the code since) take today's defaults.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import torch

from minbert.files import atomic_write_text

RECORD_FILE = "args.json"
RECORD_KEYS = ("args", "resolved", "git", "environment", "derived_from", "segments")


def git_commit(folder: Path) -> dict | None:
    """{"commit": HEAD's hash, "dirty": whether tracked files differ from it} of the checkout holding `folder`;
    None when it is not in one or git is missing or fails: a run never stops for its description."""
    def git(*command: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *command], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        # untracked files are left out: a checkout always has some (runs/, predictions/), as `git describe --dirty`
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def environment(device: torch.device) -> dict:
    """Python's, torch's and CUDA's versions and the GPUs' names (those of the visible devices when the run uses
    CUDA, none otherwise)."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if device.type == "cuda" else []
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpus": gpus}


def run_record(settings: dict, resolved: dict, source: Path, device: torch.device, segments: list[dict]) -> dict:
    """args.json's content for a run started or resumed now with `settings` (plain values by field name) from the
    code in `source`, having run in `segments` (run_segments)."""
    return {"args": settings, "resolved": resolved, "git": git_commit(source), "environment": environment(device),
            "segments": segments}


def run_segments(output_dir: Path, resumed: bool, first_stage: int, resolved: dict) -> list[dict]:
    """The record's segments with this one, which begins (or continues) at stage `first_stage` (1-based) with its
    settings resolved to `resolved`. A resumed run's earlier ones come from OUTPUT_DIR/args.json: one written before
    records had segments is one segment of its "resolved", begun at an unknown stage; without a readable record the
    earlier stages are one segment described by null."""
    segment = {"first_stage": first_stage, "resolved": resolved}
    if not resumed:
        return [segment]
    try:
        earlier = json.loads((Path(output_dir) / RECORD_FILE).read_text())
        if isinstance(earlier.get("segments"), list):
            return [*earlier["segments"], segment]
        described = {"first_stage": None, "resolved": dict(earlier["resolved"])}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):  # a run never stops for its description
        described = {"first_stage": None, "resolved": None}
    return [described, segment]


def write_run_record(output_dir: Path, record: dict) -> Path:
    """OUTPUT_DIR/args.json, replaced whole."""
    path = Path(output_dir) / RECORD_FILE
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path


def working_dir_of(run: Path, settings: dict) -> Path | None:
    """The folder the relative paths among a run's recorded `settings` (its flags as typed) are relative to: the
    working directory it started in, not the reader's. Where the run's folder now ends in its recorded relative
    --output_dir, the folder above those parts (a tree moved whole, to another machine or Drive mount, still reads);
    else the working_dir its args.json recorded; else None: unknown (an older run, moved)."""
    output_dir = settings.get("output_dir")
    if isinstance(output_dir, str) and output_dir and not Path(output_dir).is_absolute():
        parts, here = Path(os.path.normpath(output_dir)).parts, Path(run).resolve().parts
        if ".." not in parts and len(parts) < len(here) and here[len(here) - len(parts):] == parts:
            return Path(*here[:len(here) - len(parts)])
    try:
        recorded = json.loads((Path(run) / RECORD_FILE).read_text(encoding="utf-8"))["resolved"]["working_dir"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return Path(recorded) if isinstance(recorded, str) else None


def recorded_path(value: str, working_dir: Path | None) -> Path:
    """A path a run recorded, as it was meant: a relative one against the run's working directory (working_dir_of;
    the reader's own when unknown)."""
    path = Path(value)
    return path if path.is_absolute() or working_dir is None else working_dir / path


def recorded_pretrained(checkpoint: Path, metadata: dict) -> str | None:
    """The pretrained model a checkpoint (PREFIX, in its run's folder) came from, as its metadata records it: a
    relative path read against the run's working directory (working_dir_of) when it is there, else the name as
    recorded (an alias such as minilm-l6, a Hub name); None when the checkpoint does not say."""
    settings = metadata.get("args") if isinstance(metadata.get("args"), dict) else {}
    base = metadata.get("base") if isinstance(metadata.get("base"), dict) else {}
    name = settings.get("pretrained") or base.get("pretrained")
    if not isinstance(name, str) or not name:
        return None
    path = recorded_path(name, working_dir_of(Path(checkpoint).parent, settings))
    return str(path) if path.exists() else name
