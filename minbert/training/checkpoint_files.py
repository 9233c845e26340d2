"""The training state's files in a run's folder: what only --resume reads (OUTPUT_DIR/last.*, the newest, and with
--save_total_limit N the N-1 before it as checkpoint-U.*, U the updates done when it was saved), their rotation, their
removal once the run has finished (finished.json then says the run is done), and the folder's size.

    keep_earlier_checkpoint(output_dir, total_limit)     # before last.* is saved again
    remove_resume_state(output_dir)                       # the run has finished
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from minbert.files import atomic_write_text, remove_files

LAST = "last"  # the newest checkpoint, which --resume continues
FINISHED_FILE = "finished.json"  # a finished run's stages, and whether its training state was kept
NUMBERED = re.compile(r"checkpoint-(\d+)\.(json|safetensors)")
SUFFIXES = (".safetensors", ".json")


def numbered_checkpoints(output_dir: Path) -> dict[int, Path]:
    """The earlier checkpoints kept in OUTPUT_DIR, by their updates: each one's prefix (checkpoint-U)."""
    found = {}
    for path in output_dir.glob("checkpoint-*.json"):
        match = NUMBERED.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = path.with_suffix("")
    return dict(sorted(found.items()))


def resume_state_files(output_dir: Path) -> list[Path]:
    """Every file of OUTPUT_DIR's training state (last.*, checkpoint-U.*) that exists."""
    names = [f"{LAST}{suffix}" for suffix in SUFFIXES]
    names += [path.name for path in output_dir.glob("checkpoint-*.*") if NUMBERED.fullmatch(path.name)]
    return [output_dir / name for name in names if (output_dir / name).is_file()]


def keep_earlier_checkpoint(output_dir: Path, total_limit: int) -> None:
    """Before last.* is replaced: with total_limit N > 1, keep it as checkpoint-U.* (a hard link where the file system
    has them: no copy, as the save replaces last.* by a new file), then remove the oldest beyond N-1 earlier ones."""
    info = output_dir / f"{LAST}.json"
    if total_limit < 2 or not info.is_file():
        return
    updates = json.loads(info.read_text(encoding="utf-8"))["updates"]
    for suffix in SUFFIXES:
        link_or_copy((output_dir / LAST).with_suffix(suffix), (output_dir / f"checkpoint-{updates}").with_suffix(suffix))
    earlier = list(numbered_checkpoints(output_dir).values())
    remove_files(path.with_suffix(suffix) for path in earlier[:max(0, len(earlier) - (total_limit - 1))]
                 for suffix in SUFFIXES)


def link_or_copy(source: Path, target: Path) -> None:
    """`target` the same file as `source`: a hard link, or a copy where links are not allowed (Google Drive)."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def make_last(prefix: Path) -> list[Path]:
    """Continue from the checkpoint `prefix` of its folder (--resume_from): it becomes last.*, and the checkpoints
    saved after it, which its continuation replaces, are removed; returns those removed."""
    output_dir = prefix.parent
    if prefix.name != LAST:
        for suffix in SUFFIXES:
            link_or_copy(prefix.with_suffix(suffix), (output_dir / LAST).with_suffix(suffix))
    updates = json.loads(prefix.with_suffix(".json").read_text(encoding="utf-8"))["updates"]
    later = [path for done, path in numbered_checkpoints(output_dir).items() if done > updates]
    return remove_files(path.with_suffix(suffix) for path in later for suffix in SUFFIXES)


def remove_resume_state(output_dir: Path, stage_labels: list[str], keep: bool) -> list[Path]:
    """The run has finished: finished.json records its stages, and unless `keep` its training state goes (the kept
    model best.*, the reports and predictions stay); returns the files removed."""
    atomic_write_text(output_dir / FINISHED_FILE, json.dumps({"stages": stage_labels, "resume_state_kept": keep}))
    return [] if keep else remove_files(resume_state_files(output_dir))


def finished_stages(output_dir: Path) -> list[str] | None:
    """The stages of the run that finished in OUTPUT_DIR (finished.json), or None when none did."""
    try:
        stages = json.loads((output_dir / FINISHED_FILE).read_text(encoding="utf-8"))["stages"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return stages if isinstance(stages, list) else None


def folder_size(folder: Path) -> int:
    """The bytes of every file under `folder`."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def human_size(size: int) -> str:
    """1234567 -> '1.2 MB' (powers of 1000, as Google Drive counts)."""
    value, unit = float(size), "B"
    for bigger in ("kB", "MB", "GB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"
