"""A worker's trials: each one's parameters, its record in its folder (trusted only where this study wrote it), its
seeds' runs, and the trials that dead workers left running, continued from their checkpoints."""
from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

from minbert.files import atomic_write_text
from minbert.sweeps.runs import TrialFailed, run_folders, run_seed
from minbert.sweeps.settings import Parameter, Sweep, SweepError

TRIAL_RECORD = "sweep_trial.json"  # in a trial's folder: its parameters, each seed's score, how it ended
FAILURES_IN_A_ROW = 3  # a worker whose trials fail so often stops: the base run itself cannot run


class SurplusTrial(RuntimeError):
    """A trial begun by one worker while another filled the last place: it fails unrun and is not listed."""


def suggest(trial, space: tuple[Parameter, ...]) -> dict:
    """The trial's value of each parameter whose conditions hold, in the space's order."""
    chosen: dict = {}
    for p in space:
        if not p.searched_under(chosen):
            continue
        if p.kind == "choices":
            # Optuna stores choices of JSON scalars; a list (a flag of several words) is chosen by its JSON text.
            texts = [json.dumps(c) for c in p.choices]
            chosen[p.name] = json.loads(trial.suggest_categorical(p.name, texts)) if any(
                isinstance(c, (list, dict)) for c in p.choices) else trial.suggest_categorical(p.name, list(p.choices))
        elif p.kind == "int":
            chosen[p.name] = trial.suggest_int(p.name, p.low, p.high, step=p.step or 1, log=p.log)
        else:
            value = trial.suggest_float(p.name, p.low, p.high, step=p.step, log=p.log)
            # Optuna's grid is low + k * step in binary floats (0.15000000000000002): the run's flag and its
            # args.json read as the grid's own decimal instead.
            chosen[p.name] = round(value, 12) if p.step else value
    return chosen


def read_trial_record(folder: Path) -> dict | None:
    """The trial record in a folder; None where there is none, or none that a sweep wrote."""
    try:
        record = json.loads((folder / TRIAL_RECORD).read_text(encoding="utf-8"))
        return record if isinstance(record, dict) and isinstance(record.get("seeds"), dict) else None
    except (OSError, ValueError):
        return None


def trusted_record(folder: Path, trial, params: dict, continued: list[int]) -> dict:
    """The trial's record in its folder (the seeds that a killed worker finished), or a new one where the folder is
    new. SweepError where the folder holds anything else: a trial of another study of this name (one begun again
    in a new database), a trial with other parameters, or files that no sweep recorded. Such a folder is another
    run's: its scores are not this trial's, and its files are not replaced."""
    study = trial.study.user_attrs["sweep"]
    record = read_trial_record(folder)
    if record is None:
        if folder.is_dir() and any(folder.iterdir()):
            raise foreign_folder(trial, folder, "files that no trial of a sweep recorded")
        return {"study": trial.study.study_name, "study_id": study["id"], "begun": study["begun"],
                "trial": trial.number, "params": params, "seeds": {}}
    if record.get("study_id") != study["id"]:
        begun = f"begun {record['begun']}" if "begun" in record else "recorded without a study id"
        raise foreign_folder(trial, folder, f"a trial of another study named {trial.study.study_name} ({begun})")
    if record.get("trial") not in (trial.number, *continued) or record.get("params") != params:
        raise foreign_folder(trial, folder, f"trial {record.get('trial')} of this study, with other parameters")
    return record


def foreign_folder(trial, folder: Path, what: str) -> SweepError:
    """The refusal of a folder that is not the trial's (trusted_record), noted on the trial for the summary."""
    message = (f"{folder} holds {what}, not trial {trial.number} of this study (begun "
               f"{trial.study.user_attrs['sweep']['begun']}): move it away, or name a new study")
    trial.set_user_attr("note", message)
    return SweepError(message)


def write_trial_record(folder: Path, record: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / TRIAL_RECORD, json.dumps(record, indent=2) + "\n")


def process_started(pid: int) -> str | None:
    """A process's start time (Linux's /proc), so that a reused process id is not taken for the worker."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


WORKER = {"host": socket.gethostname(), "pid": os.getpid(), "started": process_started(os.getpid())}


def worker_gone(worker) -> bool:
    """Whether the worker recorded on a trial was a process of this machine that has ended."""
    if not isinstance(worker, dict) or worker.get("host") != WORKER["host"] or not isinstance(worker.get("pid"), int):
        return False
    try:
        os.kill(worker["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return worker.get("started") is not None and process_started(worker["pid"]) != worker["started"]


def continue_trial(study, frozen) -> None:
    """A trial whose worker died, queued again (WAITING) with its parameters and folder: the next worker to ask
    for a trial takes it and continues its runs from their checkpoints. Optuna's RetryHeartbeatStaleTrialCallback
    without the dead worker's record, which would make the queued copy look orphaned as soon as it starts."""
    import optuna
    system_attrs = {"failed_trial": frozen.number, "retry_history": [], **frozen.system_attrs}
    system_attrs["retry_history"] = [*system_attrs["retry_history"], frozen.number]
    user_attrs = {key: value for key, value in frozen.user_attrs.items() if key != "worker"}
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.WAITING, params=frozen.params,
                                        distributions=frozen.distributions, user_attrs=user_attrs,
                                        system_attrs=system_attrs))
    print(f"note: trial {frozen.number} was left running by a worker that is gone; it continues as a new trial",
          file=sys.stderr)


def take_over_orphans(study, grace_seconds: int) -> None:
    """Trials left RUNNING by dead workers, failed and queued again (continue_trial): those of this machine's
    ended processes now, those of other machines once their heartbeat is older than the grace period (Optuna's
    fail_stale_trials), and those begun by no recorded worker after the grace period. Failing a trial is the
    storage's one-winner update, so two workers never both take the same one."""
    import optuna
    from optuna.storages import fail_stale_trials
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        fail_stale_trials(study)
    now = datetime.datetime.now()
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = frozen.user_attrs.get("worker")
        unclaimed = worker is None and frozen.datetime_start is not None and \
            (now - frozen.datetime_start).total_seconds() > grace_seconds
        if not (worker_gone(worker) or unclaimed):
            continue
        try:
            failed = study._storage.set_trial_state_values(frozen._trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker took it
        if failed:
            continue_trial(study, study._storage.get_trial(frozen._trial_id))


def is_continuation(frozen) -> bool:
    return "failed_trial" in frozen.system_attrs


def places_taken(study, before: int | None = None) -> int:
    """The sweep's trials begun so far (below trial number `before`): a continuation takes its original's place."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if not is_continuation(t) and (before is None or t.number < before))


def waiting_trials(study) -> int:
    import optuna
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def leave_running() -> None:
    """Ctrl-C in a trial: this process ends at once, leaving the trial RUNNING under it as if it had been killed
    (Optuna would fail it), so that the next run of the same command continues it from its checkpoint
    (take_over_orphans)."""
    print("\ninterrupted: rerun the same command to continue the sweep, this trial from its checkpoint",
          file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(130)


def objective(trial, sweep: Sweep) -> float:
    """A trial: the mean of the objective over its seeds' runs, each reporting to the pruner (the first seed's)."""
    trial.set_user_attr("worker", WORKER)
    frozen = trial.study._storage.get_trial(trial._trial_id)
    if not is_continuation(frozen) and places_taken(trial.study, before=trial.number) >= sweep.trials:
        trial.set_user_attr("surplus", True)
        raise SurplusTrial(f"trial {trial.number}: the sweep's {sweep.trials} trials were begun by other workers")
    folder_name = frozen.user_attrs.get("folder") or f"trial_{trial.number}"
    trial.set_user_attr("folder", folder_name)
    folder = sweep.folder / folder_name
    params = suggest(trial, sweep.space)
    trial.set_user_attr("values", params)  # as the flags take them (a list chosen by its JSON text is a list here)
    record = trusted_record(folder, trial, params, frozen.system_attrs.get("retry_history", []))
    record.update(trial=trial.number, state="running")
    write_trial_record(folder, record)
    try:
        for position, (seed, run) in enumerate(zip(sweep.seeds, run_folders(folder, sweep.seeds))):
            if str(seed) not in record["seeds"]:
                record["seeds"][str(seed)] = run_seed(trial, sweep, params, seed, run, report=position == 0)
                write_trial_record(folder, record)
    except KeyboardInterrupt:
        leave_running()
    except Exception as err:
        import optuna
        pruned = isinstance(err, optuna.TrialPruned)
        record.update(state="pruned" if pruned else "failed", note=str(err))
        write_trial_record(folder, record)
        trial.set_user_attr("note", str(err))
        raise
    record["state"] = "complete"
    write_trial_record(folder, record)
    return sum(record["seeds"][str(seed)] for seed in sweep.seeds) / len(sweep.seeds)


def work(study, sweep: Sweep) -> None:
    """This worker's share of the sweep: trials, one at a time, until the sweep's places are taken and none waits
    to be continued, or the time budget is spent. Trials failing one after another (a base run that cannot run:
    its data or model missing) stop it rather than use up the sweep."""
    import optuna
    started, failures = time.monotonic(), []
    while sweep.timeout is None or time.monotonic() - started < sweep.timeout:
        take_over_orphans(study, sweep.heartbeat * 3)
        if places_taken(study) >= sweep.trials and not waiting_trials(study):
            return
        ended = []
        study.optimize(lambda trial: objective(trial, sweep), n_trials=1, catch=(TrialFailed, SurplusTrial),
                       callbacks=[lambda _, frozen: ended.append(frozen)])
        if ended and ended[0].state == optuna.trial.TrialState.FAIL and "note" in ended[0].user_attrs:
            failures.append(ended[0].user_attrs["note"])
            if len(failures) == FAILURES_IN_A_ROW:
                raise SweepError(f"{FAILURES_IN_A_ROW} trials in a row failed, the last: {failures[-1]}")
        elif ended and not ended[0].user_attrs.get("surplus"):
            failures.clear()
