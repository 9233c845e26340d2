"""The study: its storage (the URL's password never shown), created by the first worker with the sweep's settings
and a unique id or loaded and checked against them, and forgotten when every trial failed. Optuna and SQLAlchemy
are imported here only when a sweep runs."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import time
import uuid
import warnings
from pathlib import Path

from minbert.sweeps.runs import POLL_SECONDS
from minbert.sweeps.settings import Parameter, Sweep, SweepError
from minbert.sweeps.trials import continue_trial, read_trial_record

STORAGE_VARIABLE = "MINBERT_SWEEP_STORAGE"  # --storage's URL, kept out of shell history and ps
CREATOR_SECONDS = 5  # how long a worker waits for the one that created the study to record its id


def storage_url(storage: str | None, sweeps_dir: Path, study: str) -> tuple[str, str]:
    """The study's database URL and where it came from: --storage (`storage`), else $MINBERT_SWEEP_STORAGE, else
    SQLite beside the study's folder."""
    if storage:
        return storage, "--storage"
    if os.environ.get(STORAGE_VARIABLE):
        return os.environ[STORAGE_VARIABLE], STORAGE_VARIABLE
    return f"sqlite:///{(sweeps_dir / f'{study}.db').resolve()}", "--storage"


def parsed_url(url: str):
    """SQLAlchemy's reading of a database URL; None where it cannot read it."""
    import sqlalchemy.engine
    import sqlalchemy.exc
    try:
        return sqlalchemy.engine.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return None


def shown_url(url: str) -> str:
    """A database URL as messages show it: its password masked (by pattern where SQLAlchemy cannot read it)."""
    parsed = parsed_url(url)
    return parsed.render_as_string(hide_password=True) if parsed else re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def hide_password(text: str, url: str) -> str:
    """`text` (a driver's error) with the URL's password masked, should the driver quote it."""
    password = getattr(parsed_url(url), "password", None)
    return text.replace(str(password), "***") if password else text


def open_storage(url: str, shown: str, heartbeat: int):
    """Optuna's RDB storage at `url`, its tables created; SweepError in one line where it cannot be opened."""
    import optuna
    import sqlalchemy.exc
    # A lock held by another worker is waited for; an unreachable server is given up on after a while.
    connect_args = ({"timeout": 60} if url.startswith("sqlite")
                    else {"connect_timeout": 10} if url.startswith(("postgresql", "mysql")) else {})
    for attempt in range(3):  # the last attempt returns or raises
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": connect_args},
                                                  heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
                                                  heartbeat_stale_trial_callback=continue_trial)
        except (ImportError, ValueError, sqlalchemy.exc.SQLAlchemyError) as err:
            reason = str(getattr(err, "orig", None) or err).strip().splitlines()
            # Workers started together on a new database race to create its tables: the losers open it again.
            if attempt < 2 and (isinstance(err, sqlalchemy.exc.IntegrityError) or "already exists" in str(err)):
                time.sleep(1)
                continue
            reason = reason[0] if reason else type(err).__name__
            raise SweepError(f"{shown}: cannot open it ({hide_password(reason, url)})") from None


def sweep_identity(sweep: Sweep) -> dict:
    """What a study's trials were scored under: a later run of the sweep must not change it."""
    return {"space": [dataclasses.asdict(p) for p in sweep.space], "base": list(sweep.base),
            "objective": sweep.objective, "direction": sweep.direction, "seeds": list(sweep.seeds)}


def make_pruner(sweep: Sweep):
    import optuna
    if sweep.pruner == "median":
        # Stages are reported from step 1, and Optuna's warm-up counts steps from 0: stage warmup_stages + 1 is the
        # first one judged.
        return optuna.pruners.MedianPruner(n_startup_trials=sweep.startup_trials,
                                           n_warmup_steps=sweep.warmup_stages + 1)
    return optuna.pruners.SuccessiveHalvingPruner() if sweep.pruner == "halving" else optuna.pruners.NopPruner()


def open_study(sweep: Sweep):
    """The study, created by the first worker (which records its settings, a unique id and when it was begun) or
    loaded; SweepError where it was begun with other settings or by a sweep.py that recorded no id."""
    import optuna
    storage = open_storage(sweep.storage, sweep.storage_shown, sweep.heartbeat)
    identity = json.loads(json.dumps(sweep_identity(sweep)))
    try:  # one worker creates it (the storage's unique study name), the others load it
        study = optuna.create_study(storage=storage, study_name=sweep.study, direction=sweep.direction,
                                    pruner=make_pruner(sweep))
        study.set_user_attr("sweep", {**identity, **new_study_id()})
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(storage=storage, study_name=sweep.study, pruner=make_pruner(sweep))
    recorded = recorded_identity(study, identity)
    changed = [key for key in identity if recorded.get(key) != identity[key]]
    if changed:
        raise SweepError(f"--study {sweep.study}: it was begun with another {', '.join(changed)} "
                         f"({sweep.storage_shown}); give those of its first run or name a new study")
    if "id" not in recorded:
        raise SweepError(f"--study {sweep.study}: begun by an earlier scripts/sweep.py, whose trial folders record no "
                         f"study id ({sweep.storage_shown}); name a new study")
    for configuration in sweep.enqueued:  # once: a configuration already queued or run is not queued again
        study.enqueue_trial(stored_params(sweep.space, configuration), skip_if_exists=True)
    return study


def new_study_id() -> dict:
    """What tells this study from any other of its name (a study begun again in a new database, say), in its
    trials' records."""
    return {"id": uuid.uuid4().hex, "begun": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def recorded_identity(study, identity: dict) -> dict:
    """The study's recorded settings and id, written by the worker that created it a moment ago; recorded now where
    that worker died before it could, or the study was created outside the sweep (its trials queued by hand)."""
    deadline = time.monotonic() + CREATOR_SECONDS
    while time.monotonic() < deadline:
        if "sweep" in study.user_attrs:
            return study.user_attrs["sweep"]
        time.sleep(POLL_SECONDS)
    study.set_user_attr("sweep", {**identity, **new_study_id()})
    return study.user_attrs["sweep"]


def stored_params(space: tuple[Parameter, ...], configuration: dict) -> dict:
    """A configuration as Optuna stores it: a choice among lists (a flag of several words) by its JSON text, as
    suggest() asks for it."""
    textual = {p.name for p in space if p.kind == "choices" and any(isinstance(c, (list, dict)) for c in p.choices)}
    return {name: json.dumps(value) if name in textual else value for name, value in configuration.items()}


def refuse_if_every_trial_failed(study) -> None:
    import optuna
    trials = study.get_trials(deepcopy=False)
    if trials and all(t.state == optuna.trial.TrialState.FAIL for t in trials):
        notes = [t.user_attrs["note"] for t in trials if "note" in t.user_attrs] or ["(none noted)"]
        raise SweepError(f"every trial failed ({len(trials)}), the last: {notes[-1]}")


def forget_if_nothing_kept(study, sweep: Sweep) -> bool:
    """A study whose every trial failed, removed with its trials' folders, so that the same command, run again once
    the problem is fixed, begins it afresh rather than finding its name taken by failures. A folder that another
    study's record holds (trusted_record refused it) is left alone."""
    import optuna
    trials = study.get_trials(deepcopy=False)
    if any(t.state != optuna.trial.TrialState.FAIL for t in trials):
        return False
    study_id = study.user_attrs["sweep"]["id"]
    for frozen in trials:
        folder = sweep.folder / frozen.user_attrs.get("folder", "")
        record = read_trial_record(folder) if "folder" in frozen.user_attrs else None
        if record is not None and record.get("study_id") == study_id:
            shutil.rmtree(folder)
    optuna.delete_study(study_name=sweep.study, storage=study._storage)
    with contextlib.suppress(OSError):  # the study's folder, unless it holds anything else
        sweep.folder.rmdir()
    return True
