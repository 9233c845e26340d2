"""args.json for run folders made before runs wrote their own (run_record.py): derived from the settings the run
saved in best.json (or last.json), so that `python multitask_classifier.py --config RUN/args.json --output_dir NEW`
trains it again. Settings added to the code since the run take today's defaults (the script names them per run:
"predates"); where such a default changed what the code did (runs before --smart_precision ran SMART's passes in
exact float32), add the flag that restores it. Folders with a history but no saved settings are listed: they cannot
be described.

    python scripts/write_args_json.py results          # every run folder under results/, at any depth

A folder's args.json written by its run (it has no "derived_from") is left as it is.
A damaged best.json, last.json or args.json, or saved settings that --config would refuse (each checked as
multitask_classifier.py checks them), stops it before anything is written: one line naming the file.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from minbert.arguments import OneLineErrorParser
from minbert.run.run_record import RECORD_FILE, write_run_record
from minbert.run.training_args import TrainingArguments, settings_as_config

SETTINGS_FILES = ("best.json", "last.json")  # where a run saved its settings ("args"), best first
RUN_FILES = (*SETTINGS_FILES, "history.json", "metrics.jsonl")  # any of these makes a folder a run's


class RecordError(ValueError):
    """A run's saved settings or args.json that cannot be read, or settings --config would refuse; str() is one line
    naming the file."""


def read_object(path: Path) -> dict:
    """The JSON object in `path`; RecordError naming it for one damaged (cut short, not UTF-8, not an object)."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise RecordError(f"{path}: cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise RecordError(f"{path}: not UTF-8 text: a damaged run record") from None
    except (ValueError, RecursionError) as err:
        raise RecordError(f"{path}: not JSON ({err}): a damaged run record") from None
    if not isinstance(content, dict):
        raise RecordError(f"{path}: not a run record (a JSON object), found {type(content).__name__}")
    return content


def saved_settings(run: Path) -> tuple[str, dict] | None:
    """(file name, settings) of the first of SETTINGS_FILES that holds the run's settings, or None. A damaged one is
    a RecordError, never passed over for the next: last.json's settings are not the kept model's."""
    for name in SETTINGS_FILES:
        path = run / name
        if path.is_file():
            settings = read_object(path).get("args")
            if isinstance(settings, dict):
                return name, settings
    return None


def check_trains_again(source: Path, settings: dict, known: list[str]) -> None:
    """RecordError naming `source` unless `multitask_classifier.py --config` takes the settings this code still has
    (args.json's purpose): each value of its field's type and choices, then the command line's own validation."""
    try:
        settings_as_config(TrainingArguments, str(source), {k: v for k, v in settings.items() if k in known})
    except ValueError as err:  # read_config's say "--config SOURCE: 'lr' must be ...", the command line's name the flag
        message = str(err)
        raise RecordError(message.removeprefix("--config ") if message.startswith(f"--config {source}: ")
                          else f"{source}: its settings would not train again ({message})") from None


def derived_record(source: str, settings: dict) -> dict:
    """args.json of a run known only by its saved settings: nothing about where or with which code it ran."""
    return {"args": settings, "resolved": None, "git": None, "environment": None, "derived_from": source}


def run_folders(roots: list[Path]) -> list[Path]:
    """Every folder under `roots` (themselves included) holding one of RUN_FILES, sorted."""
    found = set()
    for root in roots:
        for folder in (root, *(path for path in root.rglob("*") if path.is_dir())):
            if any((folder / name).is_file() for name in RUN_FILES):
                found.add(folder)
    return sorted(found)


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="run folders, or folders holding them at any depth")
    args = parser.parse_args(argv)
    missing = [str(folder) for folder in args.folders if not folder.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    known = [f.name for f in dataclasses.fields(TrainingArguments)]
    # Every run read and checked before anything is written: one bad record refuses the command, not half its runs.
    plans = []  # (run, its settings file's name and settings, or None; whether its args.json is its own)
    try:
        for run in run_folders(args.folders):
            existing = run / RECORD_FILE
            if existing.is_file() and "derived_from" not in read_object(existing):
                plans.append((run, None, True))
                continue
            found = saved_settings(run)
            if found is not None:
                check_trains_again(run / found[0], found[1], known)
            plans.append((run, found, False))
    except RecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for run, found, own in plans:
        if own:
            print(f"{run}: kept its own {RECORD_FILE}")
            continue
        if found is None:
            print(f"{run}: no saved settings (no best.json or last.json with 'args'): cannot be described")
            continue
        write_run_record(run, derived_record(*found))
        gone = sorted(set(found[1]) - set(known))
        predates = [name for name in known if name not in found[1]]
        print(f"{run}: wrote {RECORD_FILE} from {found[0]}"
              + (f"; predates {', '.join(predates)}" if predates else "")
              + (f"; holds settings this code no longer has: {', '.join(gone)}" if gone else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
