"""Hyperparameter sweeps of multitask_classifier.py on Optuna, resumable, on one machine or many (docs/sweeps.md).

    python scripts/sweep.py --study lr_smart --space space.json --trials 20 -- --demo
    python scripts/sweep.py --study lr_smart --space space.json --trials 20 --seeds 3 -- --config recipe.json
    python scripts/sweep.py ... --storage postgresql://user@host/sweeps      # workers on several machines

The flags after `--` are the base run, as multitask_classifier.py takes them; each trial adds the space's flags
(space.json: {"lr": {"float": [1e-5, 1e-3], "log": true}, "smart": {"choices": [true, false]},
"smart_weight": {"float": [1, 20], "when": {"smart": true}}}), its seed, its --output_dir
(SWEEPS/STUDY/trial_N, or trial_N/seed_S with --seeds) and its CSVs inside that folder. Every trial is an ordinary
run: its args.json reruns it with --config. The study lives in SWEEPS/STUDY.db (SQLite) unless --storage (or
$MINBERT_SWEEP_STORAGE, which keeps a password out of shell history) names another database; the same command run again, or by several workers at once, continues it, and a trial whose
worker was killed continues from its own checkpoint.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import difflib
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

from minbert.arguments import OneLineErrorParser
from minbert.files import atomic_write_text
from minbert.run.run_settings import run_schedule, run_tasks
from minbert.run.training_args import TrainingArguments, build_parser, data_paths, parse_training_args
from minbert.tasks import MULTITASK, TASKS, data_flag, default_output, output_flag
from minbert.training.checkpoint_files import FINISHED_FILE
from minbert.training.schedules import train_tasks

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "multitask_classifier.py"
TRIAL_RECORD = "sweep_trial.json"  # in a trial's folder: its parameters, each seed's score, how it ended
RUN_LOG = "sweep.log"  # in a run's folder: what the run printed
POLL_SECONDS = 0.5
STORAGE_VARIABLE = "MINBERT_SWEEP_STORAGE"  # --storage's URL, kept out of shell history and ps
CREATOR_SECONDS = 5  # how long a worker waits for the one that created the study to record its id
FAILURES_IN_A_ROW = 3  # a worker whose trials fail so often stops: the base run itself cannot run
STOP_SECONDS = 120  # a pruned run's time to save its checkpoint after SIGINT before it is killed
INTERRUPT_SECONDS = 5  # a run's time to end by itself on a Ctrl-C that reached it too
# Flags the sweep sets for every trial: a space or the base flags naming them would be overridden.
SWEEP_FLAGS = ("output_dir", "resume", "config", "help")
KINDS = ("float", "int", "choices")
SPACE_KEYS = {*KINDS, "log", "step", "when"}
PLOTS = {"history.png": "plot_optimization_history", "importances.png": "plot_param_importances",
         "parallel_coordinates.png": "plot_parallel_coordinate"}


class SweepError(ValueError):
    """A sweep that cannot start or go on as asked: one line, exit code 2."""


class TrialFailed(RuntimeError):
    """A trial's run ended with an error: the trial fails, the sweep goes on."""


class SurplusTrial(RuntimeError):
    """A trial begun by one worker while another filled the last place: it fails unrun and is not listed."""


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One flag of the space: a float or int range (log scale, step) or a list of choices; `when`: the values of
    earlier parameters under which it is searched (unset otherwise, so the base run's value holds)."""
    name: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()
    when: tuple[tuple[str, tuple], ...] = ()

    def values_to_check(self) -> list:
        return list(self.choices) if self.kind == "choices" else [self.low, self.high]

    def searched_under(self, chosen: dict) -> bool:
        """Whether `chosen` (the earlier parameters' values) meets every condition of its 'when'."""
        return all(name in chosen and chosen[name] in values for name, values in self.when)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A sweep's settings: the study, where its runs go, the space, the base run's flags and what is scored."""
    study: str
    folder: Path
    storage: str
    storage_shown: str  # where the storage came from and its URL without the password, for messages
    space: tuple[Parameter, ...]
    base: tuple[str, ...]
    objective: str
    direction: str
    seeds: tuple[int, ...]
    trials: int
    timeout: float | None
    pruner: str
    startup_trials: int
    warmup_stages: int  # the median pruner's: the stages of every trial it never stops at
    heartbeat: int
    enqueued: tuple[dict, ...] = ()  # configurations queued before the sampler's, e.g. a recipe's own settings


# ---------------------------------------------------------------------------------------------------
# The space


def read_json(flag: str, path: Path):
    """The JSON file a flag names; SweepError naming the flag and the file when it cannot be read or parsed, or when
    it names a key twice (JSON keeps the last silently: a parameter given twice would be searched once)."""
    def refuse_repeats(pairs: list) -> dict:
        names = [name for name, _ in pairs]
        repeated = next((name for name in names if names.count(name) > 1), None)
        if repeated is not None:
            raise SweepError(f"{flag} {path}: {repeated!r} is named twice")
        return dict(pairs)
    try:
        return json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=refuse_repeats)
    except OSError as err:
        raise SweepError(f"{flag} {path}: cannot read it ({err.strerror or err})") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise SweepError(f"{flag} {path}: not a JSON file ({err})") from None


def read_space(path: Path) -> tuple[Parameter, ...]:
    """The space file's parameters in its order; SweepError naming the file and the parameter."""
    content = read_json("--space", path)
    if not isinstance(content, dict) or not content:
        raise SweepError(f"--space {path}: expected a JSON object of parameters by flag name, e.g. "
                         '{"lr": {"float": [1e-5, 1e-3], "log": true}}')
    parameters: list[Parameter] = []
    for name, spec in content.items():
        parameters.append(parameter_from(f"--space {path}: {name!r}", name, spec, parameters))
    return tuple(parameters)


def parameter_from(where: str, name: str, spec, earlier: list[Parameter]) -> Parameter:
    if not isinstance(spec, dict) or not set(spec) <= SPACE_KEYS or len(set(spec) & set(KINDS)) != 1:
        raise SweepError(f"{where}: expected an object with one of {', '.join(map(repr, KINDS))} and optionally "
                         f"'log', 'step', 'when', found {json.dumps(spec)}")
    kind = next(key for key in KINDS if key in spec)
    when = conditions(where, spec.get("when", {}), earlier)
    if kind == "choices":
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices or set(spec) - {"choices", "when"}:
            raise SweepError(f"{where}: 'choices' must be a non-empty list (without 'log' or 'step')")
        return Parameter(name, kind, choices=tuple(choices), when=when)
    bounds, log, step = spec[kind], spec.get("log", False), spec.get("step")
    number = int if kind == "int" else (int, float)
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(_is(b, number) for b in bounds)
            and bounds[0] < bounds[1]):
        raise SweepError(f"{where}: {kind!r} must be [low, high] with low < high, {kind} numbers, found "
                         f"{json.dumps(bounds)}")
    if not isinstance(log, bool) or (log and bounds[0] <= 0) or (step is not None and (
            log or not _is(step, number) or step <= 0)):
        raise SweepError(f"{where}: 'log' needs low > 0 and no 'step'; 'step' must be a positive {kind}")
    if step is not None and not divides(step, bounds[1] - bounds[0]):
        # Optuna would move the high end onto the grid without a word, searching a range the space does not name.
        raise SweepError(f"{where}: 'step' {step} does not divide the range {json.dumps(bounds)}: make high - low "
                         "a whole number of steps")
    return Parameter(name, kind, bounds[0], bounds[1], log, step, when=when)


def divides(step: float | int, width: float | int) -> bool:
    """Whether `width` is a whole number of `step`s, up to the rounding of decimal steps in binary (0.3 / 0.05)."""
    steps = width / step
    return math.isclose(steps, round(steps), rel_tol=1e-9)


def _is(value, types) -> bool:
    return isinstance(value, types) and not isinstance(value, bool) and math.isfinite(value)


def conditions(where: str, when, earlier: list[Parameter]) -> tuple[tuple[str, tuple], ...]:
    """A parameter's 'when': {earlier parameter: value or list of values}."""
    names = {p.name: p for p in earlier}
    if not isinstance(when, dict):
        raise SweepError(f"{where}: 'when' must be an object {{earlier parameter: value or [values]}}")
    result = []
    for name, values in when.items():
        if name not in names:
            raise SweepError(f"{where}: 'when' names {name!r}, which is not a parameter above it in the space")
        result.append((name, tuple(values) if isinstance(values, list) else (values,)))
    return tuple(result)


def flag_tokens(name: str, value, actions: dict) -> list[str]:
    """The command-line words that set flag `name` to `value`: a switch is given or left out (--no-NAME where
    the flag has one), a list is several words."""
    action = actions[name]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [f"--{name}" if value else f"--no-{name}"]
    if action.nargs == 0:  # store_true: false is the flag left out (check_space refuses a base that gives it)
        return [f"--{name}"] if value else []
    words = value if isinstance(value, list) else [value]
    return [f"--{name}", *(json.dumps(w) if isinstance(w, bool) else str(w) for w in words)]


def flag_actions() -> dict:
    """multitask_classifier.py's flags by name (destination), with their argparse actions."""
    parser = build_parser(TrainingArguments)
    return {action.dest: action for action in parser._actions if action.option_strings}


def parse_run(argv: list[str], where: str) -> TrainingArguments:
    """multitask_classifier.py's settings from `argv`, checked as it checks them; SweepError with its one line."""
    stderr, stdout = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            return parse_training_args(argv, None)
    except SystemExit:
        problem = stderr.getvalue().strip().splitlines()
        message = problem[-1].split("error: ", 1)[-1] if problem else "refused"
        raise SweepError(f"{where}: {message}") from None


def check_space(space: tuple[Parameter, ...], base: list[str], space_path: Path, seeds: int) -> None:
    """Every parameter is a flag the sweep does not set itself, and each of its bounds or choices is accepted by
    multitask_classifier.py on top of the base flags: refused now, not in the middle of the sweep."""
    actions = flag_actions()
    scratch = ["--output_dir", tempfile.gettempdir()]
    base_args = parse_run(base + scratch, "the base flags after --")
    for parameter in space:
        where = f"--space {space_path}: {parameter.name!r}"
        set_by_sweep = parameter.name in SWEEP_FLAGS or (parameter.name == "seed" and seeds > 1)
        if parameter.name not in actions or set_by_sweep:
            close = difflib.get_close_matches(parameter.name, actions, 1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            reason = ("is set by the sweep itself" if parameter.name in actions
                      else f"is not a flag of multitask_classifier.py{suggestion}")
            raise SweepError(f"{where} {reason}")
        action = actions[parameter.name]
        if action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction) \
                and getattr(base_args, parameter.name) and False in parameter.choices:
            raise SweepError(f"{where}: the base flags turn --{parameter.name} on, so the choice false cannot turn "
                             "it off; leave it out of the base flags")
        # Checked where a trial sets it: with its 'when' (a --smart_* flag with --smart; alone it would do nothing).
        under = [word for name, values in parameter.when for word in flag_tokens(name, values[0], actions)]
        for value in parameter.values_to_check():
            parse_run(base + under + flag_tokens(parameter.name, value, actions) + scratch,
                      f"{where} = {json.dumps(value)}")


def read_enqueued(path: Path, space: tuple[Parameter, ...], base: list[str]) -> tuple[dict, ...]:
    """--enqueue's configurations (a JSON object of the space's parameters, or a list of them), each a point of the
    space that multitask_classifier.py accepts: SweepError naming the file and the parameter otherwise."""
    content = read_json("--enqueue", path)
    configurations = content if isinstance(content, list) else [content]
    if not configurations or not all(isinstance(c, dict) for c in configurations):
        raise SweepError(f"--enqueue {path}: expected a JSON object of the space's parameters, or a list of them")
    actions, names = flag_actions(), [p.name for p in space]
    for configuration in configurations:
        unknown = [name for name in configuration if name not in names]
        if unknown:
            raise SweepError(f"--enqueue {path}: {unknown[0]!r} is not a parameter of the space")
        words = []
        for p in space:
            where = f"--enqueue {path}: {p.name!r}"
            searched = p.searched_under(configuration)
            if p.name not in configuration:
                if searched:
                    raise SweepError(f"{where} is missing (a queued configuration gives every parameter it searches)")
                continue
            value = configuration[p.name]
            if not searched:
                raise SweepError(f"{where} is given but its 'when' does not hold, so a trial would not search it")
            inside = value in p.choices if p.kind == "choices" else (
                _is(value, int if p.kind == "int" else (int, float)) and p.low <= value <= p.high)
            if not inside:
                raise SweepError(f"{where} = {json.dumps(value)} is outside the space")
            words += flag_tokens(p.name, value, actions)
        parse_run(base + words + ["--output_dir", tempfile.gettempdir()], f"--enqueue {path}")
    return tuple(configurations)


def check_objective(objective: str, run: TrainingArguments) -> None:
    """--objective is a dev metric that the base run records: the overall score of a run of the three default tasks,
    or a metric of one of its tasks."""
    tasks = run_tasks(run)
    known = ["overall"] if set(MULTITASK) <= set(tasks) else []
    for task in tasks:
        keys = metric_keys(task)
        if keys is None and objective.startswith(f"{task}_"):
            return  # its metrics cannot be listed before it answers: the first stage's record checks the name
        known += keys or [key for key, _ in TASKS[task].history_columns]
    if objective in known:
        return
    close = difflib.get_close_matches(objective, known, 1)
    raise SweepError(f"--objective {objective}: not a dev metric of the base run's tasks ({', '.join(tasks)}), "
                     + (f"did you mean {close[0]!r}?" if close else f"e.g. {', '.join(known)}"))


def metric_keys(task: str) -> list[str] | None:
    """The dev metrics a task records, those of its metrics of two toy predictions; None for a task whose metrics
    come from its answers (SQuAD's)."""
    import numpy as np
    try:
        return list(TASKS[task].metrics(np.array([0, 1]), np.array([0, 1])))
    except ValueError:
        return None


def check_data_files(run: TrainingArguments) -> None:
    """Every data file the base run reads is there: missing, every trial would fail on it."""
    tasks = run_tasks(run)
    trained = train_tasks(run_schedule(run), tasks)
    needed = [path for (task, split), path in data_paths(run.data_dir, run.data_files, tasks).items()
              if (split != "train" or task in trained) and not (
                  split == "test" and TASKS[task].test_file_optional and not run.data_files.get(data_flag(task, split)))]
    for path in [*needed, *map(Path, run.simcse_data)]:
        if not path.is_file():
            problem = "not a regular file" if path.exists() else "no such file"
            raise SweepError(f"the base flags after --: {path}: {problem} (every trial would read it)")


def check_base(base: list[str]) -> None:
    given = [word for word in base if word.startswith("--") and word[2:].split("=")[0] in SWEEP_FLAGS[:2]]
    if given:
        raise SweepError(f"the base flags after -- give {given[0]}: each trial's folder and resuming are the sweep's")


# ---------------------------------------------------------------------------------------------------
# A trial


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


def run_folders(trial_folder: Path, seeds: tuple[int, ...]) -> list[Path]:
    """Each seed's run folder: the trial's folder itself for one seed, trial_N/seed_S for several."""
    return [trial_folder] if len(seeds) == 1 else [trial_folder / f"seed_{seed}" for seed in seeds]


def prediction_flags(run: Path) -> list[str]:
    """Every leaderboard file flag, pointing into the run's own predictions/ (so --config reruns move them)."""
    words = []
    for f in dataclasses.fields(TrainingArguments):
        if f.metadata.get("per_file") == "predictions":
            for task in f.metadata["tasks"]:
                for split in ("dev", "test"):
                    words += [f"--{output_flag(task, split)}",
                              str(run / "predictions" / Path(default_output(task, split)).name)]
    return words


def run_command(sweep: Sweep, params: dict, seed: int, run: Path, resume: bool) -> list[str]:
    actions = flag_actions()
    words = [word for name, value in params.items() for word in flag_tokens(name, value, actions)]
    return [sys.executable, str(TRAINER), *sweep.base, *words, "--seed", str(seed), "--output_dir", str(run),
            *prediction_flags(run), "--quiet", *(["--resume"] if resume else [])]


def command_line(words: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


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


def stage_records(run: Path) -> list[dict]:
    """The run's metrics.jsonl so far: whole lines only (the run may be writing the last one)."""
    try:
        text = (run / "metrics.jsonl").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    records = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("index"), int)]


_PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None


def _die_with_the_sweep() -> None:
    """In the run's process before it starts: killed when the sweep dies (PR_SET_PDEATHSIG), so that a sweep killed
    with kill -9 leaves no run writing in a folder that its rerun continues in."""
    _PRCTL(1, signal.SIGKILL)


def start_run(command: list[str], run: Path) -> subprocess.Popen:
    run.mkdir(parents=True, exist_ok=True)
    with open(run / RUN_LOG, "a", encoding="utf-8") as log:
        log.write(f"\n$ {command_line(command)}\n")
        log.flush()
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_the_sweep if _PRCTL else None)


def stop_run(process: subprocess.Popen) -> int:
    """SIGINT, as Ctrl-C: the run ends with exit code 130 after saving where it is; killed if it does not."""
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def watch_run(process: subprocess.Popen, trial, sweep: Sweep, run: Path, report: bool) -> int | None:
    """Reports each stage's objective to the trial as the run records it; the stage at which the pruner stopped
    the run, or None when it ran to its end."""
    reported: set[int] = set()
    while process.poll() is None:
        time.sleep(POLL_SECONDS)
        for record in stage_records(run):
            if record["index"] >= 1 and sweep.objective not in record:  # the pretrained model's has no train_loss
                stop_run(process)
                raise SweepError(f"--objective {sweep.objective}: {run / 'metrics.jsonl'} records no such metric "
                                 f"(it has {', '.join(k for k in record if k not in ('stage', 'index'))})")
            if not report or record["index"] < 1 or record["index"] in reported:
                continue
            reported.add(record["index"])
            trial.report(record[sweep.objective], record["index"])
            if trial.should_prune():
                stop_run(process)
                return record["index"]
    return None


def last_error(run: Path) -> str:
    lines = (run / RUN_LOG).read_text(encoding="utf-8", errors="replace").splitlines()
    errors = [line for line in lines if line.startswith("error:")] or lines[-1:] or ["(no output)"]
    return errors[-1]


def kept_score(run: Path, objective: str) -> float:
    """The objective's value of the model the run kept (best.json), which its CSVs come from."""
    try:
        return float(json.loads((run / "best.json").read_text(encoding="utf-8"))["metrics"][objective])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise TrialFailed(f"{run / 'best.json'}: no {objective} of the kept model ({err})") from None


def run_seed(trial, sweep: Sweep, params: dict, seed: int, run: Path, report: bool) -> float:
    """One seed's run of the trial, continued from its checkpoint where an earlier worker left one."""
    import optuna
    # A run that finished (finished.json: its training state is gone) answers --resume with "finished" at once.
    command = run_command(sweep, params, seed, run,
                          resume=(run / "last.json").is_file() or (run / FINISHED_FILE).is_file())
    process = start_run(command, run)
    try:
        pruned_at = watch_run(process, trial, sweep, run, report)
    except KeyboardInterrupt:
        try:  # Ctrl-C in a terminal reaches the run too: it ends by itself
            process.wait(INTERRUPT_SECONDS)
        except subprocess.TimeoutExpired:
            stop_run(process)
        raise
    code = process.wait()
    if pruned_at is not None:
        raise optuna.TrialPruned(f"pruned after stage {pruned_at}")
    if code != 0:
        raise TrialFailed(f"{run}: exit code {code}: {last_error(run)}")
    return kept_score(run, sweep.objective)


# ---------------------------------------------------------------------------------------------------
# Workers and their trials


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


# ---------------------------------------------------------------------------------------------------
# The study


def storage_url(args: argparse.Namespace) -> tuple[str, str]:
    """The study's database URL and where it came from: --storage, else $MINBERT_SWEEP_STORAGE, else SQLite
    beside the study's folder."""
    if args.storage:
        return args.storage, "--storage"
    if os.environ.get(STORAGE_VARIABLE):
        return os.environ[STORAGE_VARIABLE], STORAGE_VARIABLE
    return f"sqlite:///{(args.sweeps_dir / f'{args.study}.db').resolve()}", "--storage"


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


# ---------------------------------------------------------------------------------------------------
# The results


def trial_row(frozen, best_number: int | None) -> str:
    state = frozen.state.name.lower()
    note = frozen.user_attrs.get("note", "")
    if state == "fail" and "note" not in frozen.user_attrs:
        state, note = "interrupted", "continued by a later trial"
    elif is_continuation(frozen) and not note:
        note = f"continues trial {frozen.system_attrs['failed_trial']}"
    value = "" if frozen.value is None else f"{frozen.value:.4f}"
    params = ", ".join(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
                       for name, value in frozen.params.items())
    marker = " (best)" if frozen.number == best_number else ""
    return (f"| {frozen.number}{marker} | {state} | {value} | {params} | {frozen.user_attrs.get('folder', '')} | "
            f"{note.replace('|', '/')} |")


def best_trial(study):
    import optuna
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return study.best_trial if complete else None


def summary(study, sweep: Sweep) -> str:
    """Markdown: a row per trial (not the surplus ones), the best trial and the command lines that rerun it."""
    best = best_trial(study)
    lines = [f"# Sweep {sweep.study}: {sweep.objective} ({sweep.direction}), "
             f"mean over {len(sweep.seeds)} seed(s)", "",
             "| trial | state | value | parameters | folder | note |", "|---|---|---|---|---|---|"]
    lines += [trial_row(t, best.number if best else None) for t in study.get_trials(deepcopy=False)
              if not t.user_attrs.get("surplus")]
    if best is None:
        return "\n".join(lines + ["", "No trial has completed yet."]) + "\n"
    run = run_folders(sweep.folder / best.user_attrs["folder"], sweep.seeds)[0]
    values = best.user_attrs.get("values", best.params)
    flags = [word for name, value in values.items() for word in flag_tokens(name, value, flag_actions())]
    lines += ["", f"Best: trial {best.number}, {sweep.objective} {best.value:.4f}, in {run}.", "",
              "Its run again, from its own record:", "",
              f"    python multitask_classifier.py --config {command_line([str(run / 'args.json')])} "
              "--output_dir runs/best", "",
              "Its settings as flags:", "",
              f"    python multitask_classifier.py {command_line([*sweep.base, *flags])} --seed {sweep.seeds[0]}"]
    return "\n".join(lines) + "\n"


def write_plots(study, folder: Path) -> list[str]:
    """Optuna's figures of the study as PNG files in its folder; notes for those it cannot draw yet."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as figures
    notes = []
    for name, function in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = getattr(figures, function)(study)
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            figure.savefig(folder / name, dpi=100, bbox_inches="tight")
            plt.close(figure)
        except (ValueError, RuntimeError, ZeroDivisionError, ImportError) as err:  # too few trials yet
            notes.append(f"note: no {name} yet ({err})")
    return notes


def report(study, sweep: Sweep) -> None:
    sweep.folder.mkdir(parents=True, exist_ok=True)
    text = summary(study, sweep)
    atomic_write_text(sweep.folder / "summary.md", text)
    print(text)
    for note in write_plots(study, sweep.folder):
        print(note)
    print(f"wrote {sweep.folder / 'summary.md'} and the plots beside it")


# ---------------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", required=True, help="the study's name: its folder SWEEPS/STUDY, its database")
    parser.add_argument("--space", required=True, type=Path, help="the search space, a JSON file (docs/sweeps.md)")
    parser.add_argument("--trials", type=int, default=20, help="trials of the whole sweep, all workers together")
    parser.add_argument("--timeout", type=float, help="seconds after which this worker begins no new trial")
    parser.add_argument("--objective", default="overall", help="a metric of metrics.jsonl, the kept model's")
    parser.add_argument("--direction", choices=("maximize", "minimize"), default="maximize")
    parser.add_argument("--seeds", type=int, default=1, help="runs per configuration, seeds SEED..SEED+K-1; "
                        "the trial's value is their mean")
    parser.add_argument("--pruner", choices=("median", "halving", "none"), default="median",
                        help="stops runs whose stage scores fall behind (the first seed's)")
    parser.add_argument("--startup_trials", type=int, default=5, help="trials the median pruner lets finish first")
    parser.add_argument("--warmup_stages", type=int, default=0, help="stages of each trial the median pruner never "
                        "stops at, e.g. until a sequential schedule has trained every task once")
    parser.add_argument("--sweeps_dir", type=Path, default=Path("runs/sweeps"))
    parser.add_argument("--storage", help=f"an SQLAlchemy database URL (default: ${STORAGE_VARIABLE}, else "
                        "sqlite:///SWEEPS/STUDY.db)")
    parser.add_argument("--heartbeat", type=int, default=60, help="seconds between a worker's signs of life; a "
                        "trial silent for 3 of them is continued by another worker")
    parser.add_argument("--enqueue", type=Path, help="a JSON object of the space's parameters (or a list of them): "
                        "configurations the first trials take, e.g. a recipe's own settings; queued once")
    parser.add_argument("base", nargs=argparse.REMAINDER, help="-- then multitask_classifier.py's flags")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", args.study):
        parser.error(f"--study {args.study!r}: use letters, digits, '_', '-' and '.' (it names a folder)")
    for name in ("trials", "seeds", "heartbeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.startup_trials < 0 or args.warmup_stages < 0 or (args.timeout is not None and not args.timeout > 0):
        parser.error("--startup_trials and --warmup_stages must be at least 0 and --timeout positive")
    args.base = args.base[1:] if args.base[:1] == ["--"] else args.base
    return args


def make_sweep(args: argparse.Namespace) -> Sweep:
    if args.warmup_stages and args.pruner != "median":
        raise SweepError(f"--warmup_stages is the median pruner's; --pruner is {args.pruner}")
    check_base(args.base)
    space = read_space(args.space)
    check_space(space, args.base, args.space, args.seeds)
    enqueued = read_enqueued(args.enqueue, space, args.base) if args.enqueue else ()
    base_run = parse_run(args.base + ["--output_dir", tempfile.gettempdir()], "the base flags after --")
    check_objective(args.objective, base_run)
    check_data_files(base_run)
    folder = args.sweeps_dir / args.study
    storage, source = storage_url(args)
    return Sweep(args.study, folder, storage, f"{source} {shown_url(storage)}", space, tuple(args.base), args.objective, args.direction,
                 tuple(base_run.seed + i for i in range(args.seeds)), args.trials, args.timeout, args.pruner,
                 args.startup_trials, args.warmup_stages, args.heartbeat, enqueued)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import optuna
    except ImportError:
        print("error: scripts/sweep.py needs Optuna: pip install optuna (requirements.txt)", file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = None
    try:
        sweep = make_sweep(args)
        args.sweeps_dir.mkdir(parents=True, exist_ok=True)
        study = open_study(sweep)
        work(study, sweep)
        refuse_if_every_trial_failed(study)
    except SweepError as err:
        forgotten = study is not None and forget_if_nothing_kept(study, sweep)
        print(f"error: {err}" + (f"; study {sweep.study} has no other trial, so it is removed: the same command "
                                 "begins it again" if forgotten else ""), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted between trials: rerun the same command to continue the sweep", file=sys.stderr)
        return 130
    report(study, sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
