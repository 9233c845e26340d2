"""One seed's run of a trial: multitask_classifier.py in its own process (its output in RUN/sweep.log), each stage's
objective reported to the pruner as the run records it, stopped with SIGINT when pruned, and its kept model's score."""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from minbert.run.training_args import TrainingArguments
from minbert.sweeps.settings import Sweep, SweepError
from minbert.sweeps.space import flag_actions, flag_tokens
from minbert.tasks import default_output, output_flag
from minbert.training.checkpoint_files import FINISHED_FILE

ROOT = Path(__file__).resolve().parents[2]  # the repository: minbert/sweeps/runs.py
TRAINER = ROOT / "multitask_classifier.py"
RUN_LOG = "sweep.log"  # in a run's folder: what the run printed
POLL_SECONDS = 0.5
STOP_SECONDS = 120  # a pruned run's time to save its checkpoint after SIGINT before it is killed
INTERRUPT_SECONDS = 5  # a run's time to end by itself on a Ctrl-C that reached it too


class TrialFailed(RuntimeError):
    """A trial's run ended with an error: the trial fails, the sweep goes on."""


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
