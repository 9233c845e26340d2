"""scripts/sweep.py: Optuna sweeps of multitask_classifier.py. The refusals run in process (seconds); the sweeps
themselves start the script with sys.executable on the demo's STS data with the tiny random BERT (each trial a
few seconds, most of them the run's imports), and are in the slow tier."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import DEMO, MAX_LENGTH
from minbert.sweeps import summary as sweep_summary, trials as sweep_trials
from minbert.sweeps.runs import RUN_LOG, TrialFailed
from minbert.sweeps.space import flag_actions, flag_tokens, parameter_from, parse_run, read_space
from minbert.sweeps.study import STORAGE_VARIABLE, make_pruner, open_study, sweep_identity
from minbert.sweeps.summary import PLOTS
from minbert.sweeps.trials import TRIAL_RECORD, suggest

optuna = pytest.importorskip("optuna")
import sweep  # noqa: E402  (scripts/, after the skip: the script needs Optuna)

ROOT = Path(__file__).resolve().parents[1]
SPACE = {"lr": {"float": [1e-4, 1e-2], "log": True}, "smart": {"choices": [True, False]},
         "smart_adv_weight": {"float": [1, 20], "when": {"smart": True}}}


def base_flags(checkpoint, cycles: int = 2) -> list[str]:
    """A run of STS alone (the cheapest: no t-SNE, one dev set), `cycles` + 1 stages."""
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--tasks", "sts",
            "--first_stages", "sts", "--cycle", "sts", "--cycles", str(cycles), "--max_train_examples", "16",
            "--max_length", str(MAX_LENGTH), "--batch_size", "8"]


def sweep_flags(tmp_path, space=None, study="s", trials=2, *extra) -> list[str]:
    space_file = tmp_path / "space.json"
    if not space_file.exists():
        space_file.write_text(json.dumps(space or SPACE))
    return ["--study", study, "--space", str(space_file), "--trials", str(trials), "--sweeps_dir",
            str(tmp_path / "sweeps"), "--objective", "sts_pearson", *extra]


def refusal(capsys, argv) -> str:
    assert sweep.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# ---------------------------------------------------------------------------------------------------
# Refused before any trial starts


@pytest.mark.parametrize("space, problem", [
    ("{not json", "not a JSON file"),
    ({"lr": {"float": [1e-2, 1e-4]}}, "low < high"),
    ({"lr": {"float": [0, 1e-3], "log": True}}, "'log' needs low > 0"),
    ({"lr": {"choices": []}}, "non-empty list"),
    ({"smart_adv_weight": {"float": [1, 2], "when": {"smart": True}}}, "not a parameter above it"),
    ({"smart_adv_weigth": {"float": [1, 2]}}, "did you mean 'smart_adv_weight'"),
    ({"output_dir": {"choices": ["a", "b"]}}, "set by the sweep itself"),
    ({"hidden_dropout_prob": {"float": [0.0, 1.5]}}, "hidden_dropout_prob' = 1.5"),  # refused by the run's own check
    # Optuna would search 0 ... 0.28 (and 1 ... 3) in silence.
    ({"hidden_dropout_prob": {"float": [0.0, 0.3], "step": 0.07}}, "'step' 0.07 does not divide the range [0.0, 0.3]"),
    ({"cycles": {"int": [1, 4], "step": 2}}, "'step' 2 does not divide the range [1, 4]"),
    ('{"lr": {"float": [1e-4, 1e-3]}, "smart": {"choices": [true]}, "lr": {"float": [1e-5, 1e-4]}}',
     "'lr' is named twice"),  # JSON would keep the second silently
])
def test_a_bad_space_is_refused_in_one_line_before_any_trial(tmp_path, capsys, tiny_checkpoint, space, problem):
    (tmp_path / "space.json").write_text(space if isinstance(space, str) else json.dumps(space))
    line = refusal(capsys, sweep_flags(tmp_path) + ["--", *base_flags(tiny_checkpoint)])
    assert problem in line and "space.json" in line
    assert not (tmp_path / "sweeps").exists()


def test_bad_base_flags_are_refused_in_one_line(tmp_path, capsys, tiny_checkpoint):
    line = refusal(capsys, sweep_flags(tmp_path) + ["--", *base_flags(tiny_checkpoint), "--lr", "fast"])
    assert line.startswith("error: the base flags after --:") and "--lr" in line
    line = refusal(capsys, sweep_flags(tmp_path) + ["--", *base_flags(tiny_checkpoint), "--output_dir", "x"])
    assert "--output_dir" in line
    # A switch the base turns on cannot be turned off by a trial without a --no- form: refused, not silently left on.
    (tmp_path / "space.json").write_text(json.dumps({"lnsr": {"choices": [True, False]}}))
    line = refusal(capsys, sweep_flags(tmp_path) + ["--", *base_flags(tiny_checkpoint), "--lnsr"])
    assert "the choice false cannot turn it off" in line


def test_a_bad_objective_or_a_missing_data_file_is_refused_before_any_trial(tmp_path, capsys, tiny_checkpoint):
    line = refusal(capsys, sweep_flags(tmp_path, None, "s", 2, "--objective", "sst_acc")
                   + ["--", *base_flags(tiny_checkpoint)])
    assert line.startswith("error: --objective sst_acc: not a dev metric of the base run's tasks (sts)")
    line = refusal(capsys, sweep_flags(tmp_path, None, "s", 2, "--objective", "sts_pearsons")
                   + ["--", *base_flags(tiny_checkpoint)])
    assert "did you mean 'sts_pearson'?" in line
    empty = tmp_path / "data"
    empty.mkdir()
    line = refusal(capsys, sweep_flags(tmp_path) + ["--", *base_flags(tiny_checkpoint), "--data_dir", str(empty)])
    assert line.startswith(f"error: the base flags after --: {empty}/") and "no such file" in line
    assert not (tmp_path / "sweeps").exists()


def test_a_storage_password_is_never_shown_and_the_url_may_come_from_the_environment(tmp_path, capsys,
                                                                                     tiny_checkpoint, monkeypatch):
    url, shown = "postgresql://nobody:s3cret@127.0.0.1:1/sweeps", "postgresql://nobody:***@127.0.0.1:1/sweeps"
    argv = sweep_flags(tmp_path) + ["--", *base_flags(tiny_checkpoint)]
    line = refusal(capsys, ["--storage", url, *argv])
    assert line.startswith(f"error: --storage {shown}: cannot open it (") and "s3cret" not in line
    monkeypatch.setenv(STORAGE_VARIABLE, url)
    line = refusal(capsys, argv)
    assert line.startswith(f"error: MINBERT_SWEEP_STORAGE {shown}: cannot open it (") and "s3cret" not in line
    other = "postgresql://nobody:0ther@127.0.0.1:1/sweeps"
    assert refusal(capsys, ["--storage", other, *argv]).startswith(  # the flag wins
        "error: --storage postgresql://nobody:***@127.0.0.1:1/sweeps: cannot open it (")


@pytest.mark.parametrize("url", ["postgresql://nobody@127.0.0.1:1/sweeps", "sqlite:////nonexistent/dir/s.db",
                                 "nosuchdb://x"])
def test_an_unreachable_storage_is_refused_in_one_line(tmp_path, capsys, tiny_checkpoint, url):
    line = refusal(capsys, sweep_flags(tmp_path) + ["--storage", url, "--", *base_flags(tiny_checkpoint)])
    assert line.startswith(f"error: --storage {url}: cannot open it (")


def test_a_study_is_continued_only_with_the_space_it_was_begun_with(tmp_path, capsys, tiny_checkpoint):
    argv = sweep_flags(tmp_path) + ["--", *base_flags(tiny_checkpoint)]
    (tmp_path / "sweeps").mkdir()
    open_study(sweep.make_sweep(sweep.parse_args(argv)))
    (tmp_path / "space.json").write_text(json.dumps({"lr": {"float": [1e-4, 1e-3]}}))
    assert "it was begun with another space" in refusal(capsys, argv)


def no_such_file(trial, sweep_, params, seed, run, report):
    raise TrialFailed(f"{run}: exit code 2: error: data/missing/ids-sts-train.csv: no such file")


def scored(trial, sweep_, params, seed, run, report):
    return 0.5


@pytest.mark.parametrize("trials, problem", [(4, "3 trials in a row failed, the last: "),
                                              (2, "every trial failed (2), the last: ")])
def test_a_study_whose_every_trial_fails_exits_in_one_line_and_is_begun_again_by_the_same_command(
        tmp_path, capsys, tiny_checkpoint, monkeypatch, trials, problem):
    """A base run that cannot run (here every run fails at once) stops the worker after 3 failed trials, or fails
    the sweep's every trial: one line, and nothing kept under the study's name, so the same command reruns it."""
    argv = sweep_flags(tmp_path, None, "s", trials) + ["--", *base_flags(tiny_checkpoint)]
    monkeypatch.setattr(sweep_trials, "run_seed", no_such_file)
    line = refusal(capsys, argv)
    assert line.startswith(f"error: {problem}") and "no such file" in line and "the same command begins it" in line
    storage = f"sqlite:///{tmp_path / 'sweeps' / 's.db'}"
    assert optuna.get_all_study_names(storage) == [] and not (tmp_path / "sweeps" / "s").exists()
    monkeypatch.setattr(sweep_trials, "run_seed", scored)
    monkeypatch.setattr(sweep_summary, "write_plots", lambda study, folder: [])  # seconds, and not what is tested
    assert sweep.main(argv) == 0
    assert [t.state for t in trials_of(storage)] == [optuna.trial.TrialState.COMPLETE] * trials


@pytest.mark.parametrize("begun_again", ["database deleted", "another storage", "files unrecorded"])
def test_a_trial_folder_that_is_not_this_studys_is_refused_not_trusted(tmp_path, capsys, tiny_checkpoint,
                                                                        monkeypatch, begun_again):
    """A study begun again under a used name (its database deleted, or in another --storage) finds the old study's
    trial_0, scored: its record is not this trial's, so the trial neither takes its score nor runs over its files.
    The study keeps nothing, so once the folder is moved away the same command begins it."""
    argv = sweep_flags(tmp_path, None, "s", 1) + ["--", *base_flags(tiny_checkpoint)]
    monkeypatch.setattr(sweep_summary, "write_plots", lambda study, folder: [])
    monkeypatch.setattr(sweep_trials, "run_seed", scored)
    old = tmp_path / "sweeps" / "s" / "trial_0"
    if begun_again == "files unrecorded":
        old.mkdir(parents=True)
        (old / "args.json").write_text("{}")
    else:
        assert sweep.main(argv) == 0
    if begun_again == "database deleted":
        (tmp_path / "sweeps" / "s.db").unlink()
    elif begun_again == "another storage":
        argv = ["--storage", f"sqlite:///{tmp_path / 'other.db'}", *argv]
    before = {path.name: path.read_bytes() for path in old.iterdir()}
    line = refusal(capsys, argv)
    what = "files that no trial of a sweep recorded" if begun_again == "files unrecorded" else \
        "a trial of another study named s (begun "
    assert line.startswith(f"error: {old} holds {what}") and "move it away, or name a new study" in line
    assert {path.name: path.read_bytes() for path in old.iterdir()} == before
    old.rename(tmp_path / "moved")
    assert sweep.main(argv) == 0
    record = json.loads((old / TRIAL_RECORD).read_text())
    assert record["state"] == "complete" and record["trial"] == 0 and record["study"] == "s"


def test_a_study_begun_by_a_sweep_that_recorded_no_study_id_is_refused(tmp_path, capsys, tiny_checkpoint):
    argv = sweep_flags(tmp_path) + ["--", *base_flags(tiny_checkpoint)]
    made = sweep.make_sweep(sweep.parse_args(argv))
    (tmp_path / "sweeps").mkdir()
    study = optuna.create_study(study_name="s", storage=made.storage, direction="maximize")
    study.set_user_attr("sweep", json.loads(json.dumps(sweep_identity(made))))
    assert "begun by an earlier scripts/sweep.py, whose trial folders record no study id" in refusal(capsys, argv)


def test_conditional_parameters_and_switches_become_the_flags_of_the_run():
    parameters = tuple(parameter_from("x", name, spec, []) if name != "smart_adv_weight" else
                       parameter_from("x", name, spec, [parameter_from("x", "smart", SPACE["smart"], [])])
                       for name, spec in SPACE.items())
    off = suggest(optuna.trial.FixedTrial({"lr": 1e-3, "smart": False}), parameters)
    assert off == {"lr": 1e-3, "smart": False}  # smart_adv_weight is not searched without SMART
    on = suggest(optuna.trial.FixedTrial({"lr": 1e-3, "smart": True, "smart_adv_weight": 4.0}), parameters)
    actions = flag_actions()
    words = [w for name, value in on.items() for w in flag_tokens(name, value, actions)]
    assert words == ["--lr", "0.001", "--smart", "--smart_adv_weight", "4.0"]
    assert flag_tokens("smart", False, actions) == ["--no-smart"]  # turns off a base's --smart too
    assert flag_tokens("lnsr", False, actions) == []


def test_the_median_pruner_judges_a_trial_only_after_its_warmup_stages():
    """A finished trial scored 0.9 at stages 1-3; a second one scoring 0.1 from its first stage on is stopped at
    stage 1 without warm-up, and at stage 3, the first one judged, with two warm-up stages."""
    def stopped_at(warmup_stages: int) -> int | None:
        pruner = make_pruner(SimpleNamespace(pruner="median", startup_trials=1, warmup_stages=warmup_stages))
        study = optuna.create_study(direction="maximize", pruner=pruner)
        finished = study.ask()
        for stage in (1, 2, 3):
            finished.report(0.9, stage)
        study.tell(finished, 0.9)
        behind = study.ask()
        for stage in (1, 2, 3):
            behind.report(0.1, stage)
            if behind.should_prune():
                return stage
        return None
    assert stopped_at(0) == 1 and stopped_at(2) == 3 and stopped_at(3) is None


def test_warmup_stages_with_another_pruner_is_refused_in_one_line(tmp_path, capsys, tiny_checkpoint):
    line = refusal(capsys, sweep_flags(tmp_path, None, "s", 2, "--pruner", "halving", "--warmup_stages", "2")
                   + ["--", *base_flags(tiny_checkpoint)])
    assert "--warmup_stages is the median pruner's" in line


def test_a_stepped_float_is_given_to_the_run_as_the_grids_decimal():
    dropout = parameter_from("x", "hidden_dropout_prob", {"float": [0.0, 0.3], "step": 0.05}, [])
    # Optuna's grid point 0 + 3 * 0.05 in binary floats.
    chosen = suggest(optuna.trial.FixedTrial({"hidden_dropout_prob": 0.15000000000000002}), (dropout,))
    assert flag_tokens("hidden_dropout_prob", chosen["hidden_dropout_prob"], flag_actions()) == [
        "--hidden_dropout_prob", "0.15"]


@pytest.mark.parametrize("configuration, problem", [
    ({"lr": 1e-3, "smart": False, "dropout": 0.1}, "'dropout' is not a parameter of the space"),
    ({"lr": 1e-3, "smart": True}, "'smart_adv_weight' is missing"),
    ({"lr": 1e-3, "smart": False, "smart_adv_weight": 2.0}, "'smart_adv_weight' is given but its 'when' does not hold"),
    ({"lr": 1.0, "smart": False}, "'lr' = 1.0 is outside the space"),
    ([], "expected a JSON object"),
])
def test_a_bad_enqueue_file_is_refused_in_one_line(tmp_path, capsys, tiny_checkpoint, configuration, problem):
    (tmp_path / "first.json").write_text(json.dumps(configuration))
    argv = sweep_flags(tmp_path) + ["--enqueue", str(tmp_path / "first.json"), "--", *base_flags(tiny_checkpoint)]
    line = refusal(capsys, argv)
    assert problem in line and "first.json" in line
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # the test asks for the trial itself, not through optimize
def test_an_enqueued_configuration_is_the_first_trial_and_is_queued_once(tmp_path, tiny_checkpoint):
    (tmp_path / "first.json").write_text(json.dumps({"lr": 1e-3, "smart": True, "smart_adv_weight": 4.0}))
    argv = sweep_flags(tmp_path) + ["--enqueue", str(tmp_path / "first.json"), "--", *base_flags(tiny_checkpoint)]
    (tmp_path / "sweeps").mkdir()
    for _ in range(2):  # a rerun of the same command does not queue it again
        study = open_study(sweep.make_sweep(sweep.parse_args(argv)))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.WAITING]
    trial = study.ask()
    assert suggest(trial, read_space(tmp_path / "space.json")) == {"lr": 1e-3, "smart": True,
                                                                              "smart_adv_weight": 4.0}


def test_the_cpu_best_sweep_recipes_space_and_first_trial_fit_its_base_run(tiny_checkpoint):
    """scripts/sweep_cpu_best.sh's space and its queued recipe settings pass the sweep's checks on cpu_best.sh's
    flags (the sweep refuses them before any trial otherwise: an hours-long study should not fail at its start)."""
    flags = subprocess.run(["bash", "-c", 'source scripts/_common.sh; printf "%s\\n" "${CPU_FLAGS[@]}" '
                            '"${BEST_FLAGS[@]}"'], cwd=ROOT, capture_output=True, text=True, check=True)
    base = [*flags.stdout.split(), "--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint)]
    spaces = ROOT / "scripts" / "sweep_spaces"
    argv = ["--study", "cpu_best", "--space", str(spaces / "cpu_best.json"), "--enqueue",
            str(spaces / "cpu_best_recipe.json"), "--", *base]
    made = sweep.make_sweep(sweep.parse_args(argv))
    recipe = dict(made.enqueued[0])
    words = [w for name, value in recipe.items() for w in flag_tokens(name, value, flag_actions())]
    assert parse_run(base + ["--output_dir", "x"], "base") == parse_run(
        base + words + ["--output_dir", "x"], "base")  # the queued trial is cpu_best.sh's own run


# ---------------------------------------------------------------------------------------------------
# Sweeps


def start_sweep(argv, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with open(log, "a") as out:
        return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "sweep.py"), *argv], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def finish(process: subprocess.Popen, log: Path, timeout: int = 300) -> None:
    assert process.wait(timeout) == 0, log.read_text()


def trials_of(storage: str, study: str = "s") -> list:
    return optuna.load_study(study_name=study, storage=storage).get_trials()


def wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def completed(trials) -> list:
    return [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]


def stages_recorded(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, tiny_checkpoint):
    """A 4-trial sweep killed with SIGKILL in its second trial's run, after that run's third stage; the same command
    again, interrupted with SIGINT (Ctrl-C) in its next new trial's run; the same command a third time."""
    tmp_path = tmp_path_factory.mktemp("killed")
    argv = sweep_flags(tmp_path, None, "s", 4, "--pruner", "none") + ["--", *base_flags(tiny_checkpoint, cycles=10)]
    log, folder = tmp_path / "sweep.log", tmp_path / "sweeps" / "s"
    first = start_sweep(argv, log)
    wait_for(lambda: stages_recorded(folder / "trial_1") >= 3)
    first.send_signal(signal.SIGKILL)
    first.wait()
    checkpointed = (folder / "trial_1" / "last.json").is_file()
    second = start_sweep(argv, log)  # continues trial 1 as trial 2, then begins trial 3
    wait_for(lambda: stages_recorded(folder / "trial_3") >= 3)
    second.send_signal(signal.SIGINT)
    assert second.wait(60) == 130, log.read_text()
    finish(start_sweep(argv, log), log)
    return tmp_path, checkpointed


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_resumes_with_no_trial_lost_or_duplicated(killed_and_resumed):
    tmp_path, checkpointed = killed_and_resumed
    trials = trials_of(f"sqlite:///{tmp_path / 'sweeps' / 's.db'}")
    done = completed(trials)
    folders = sorted(t.user_attrs["folder"] for t in done)
    assert folders == ["trial_0", "trial_1", "trial_3", "trial_5"] and len(done) == 4
    interrupted = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert [t.number for t in interrupted] == [1, 3] and len(trials) == 6
    for original in interrupted:
        continuation = next(t for t in done if t.user_attrs["folder"] == f"trial_{original.number}")
        assert continuation.system_attrs["failed_trial"] == original.number
        assert continuation.params == original.params
    folder = tmp_path / "sweeps" / "s"
    assert sorted(p.name for p in folder.glob("trial_*")) == folders
    commands = [line for line in (folder / "trial_1" / RUN_LOG).read_text().splitlines()
                if line.startswith("$ ")]
    # continued from its checkpoint where the kill left one, else run again from its start
    assert len(commands) == 2 and commands[1].endswith("--resume") == checkpointed
    interrupted_log = (folder / "trial_3" / RUN_LOG).read_text()
    # the run under Ctrl-C ended (by then it may have finished its stages), and its continuation resumed
    assert [line for line in interrupted_log.splitlines() if line.startswith("$ ")][1].endswith("--resume")
    summary = (folder / "summary.md").read_text()
    assert "| 1 | interrupted |" in summary and "| 3 | interrupted |" in summary
    assert summary.count("| complete |") == 4 and "continues trial 1" in summary and "continues trial 3" in summary
    for plot in PLOTS:
        assert (folder / plot).stat().st_size > 0


@pytest.mark.slow
def test_the_best_trials_config_reruns_it_to_the_same_csvs(killed_and_resumed, tmp_path):
    sweeps, _ = killed_and_resumed
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{sweeps / 'sweeps' / 's.db'}")
    run = sweeps / "sweeps" / "s" / study.best_trial.user_attrs["folder"]
    subprocess.run([sys.executable, str(ROOT / "multitask_classifier.py"), "--config", str(run / "args.json"),
                    "--output_dir", str(tmp_path / "rerun")], check=True, capture_output=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    for name in ("sts-dev-out.csv", "sts-test-out.csv"):
        assert (tmp_path / "rerun" / "predictions" / name).read_text() == (run / "predictions" / name).read_text()


@pytest.mark.slow
def test_two_workers_on_one_sqlite_file_finish_exactly_the_trials_asked(tmp_path, tiny_checkpoint):
    argv = sweep_flags(tmp_path, None, "s", 3, "--pruner", "none") + ["--", *base_flags(tiny_checkpoint, cycles=0)]
    (tmp_path / "sweeps").mkdir()
    workers = [start_sweep(argv, tmp_path / f"worker{i}.log") for i in range(2)]
    for i, worker in enumerate(workers):
        finish(worker, tmp_path / f"worker{i}.log")
    trials = trials_of(f"sqlite:///{tmp_path / 'sweeps' / 's.db'}")
    done = completed(trials)
    assert len(done) == 3 and len({t.user_attrs["folder"] for t in done}) == 3
    assert len({t.user_attrs["worker"]["pid"] for t in done}) == 2  # both worked
    assert all(t.user_attrs.get("surplus") for t in trials if t not in done)


@pytest.mark.slow
def test_a_trial_falling_behind_is_pruned_early_and_marked(tmp_path, tiny_checkpoint):
    """Trial 0 barely moves the tiny random BERT (lr 1e-9), whose STS correlation, by chance, training at lr 1e-2
    (trial 1) only lowers at every stage: the median pruner, with one trial finished before it prunes, stops
    trial 1 after its first stage."""
    space = {"lr": {"float": [1e-9, 1e-2], "log": True}}
    argv = sweep_flags(tmp_path, space, "s", 2, "--startup_trials", "1") + ["--", *base_flags(tiny_checkpoint, 10)]
    storage = f"sqlite:///{tmp_path / 'sweeps' / 's.db'}"
    (tmp_path / "sweeps").mkdir()
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.enqueue_trial({"lr": 1e-9})
    study.enqueue_trial({"lr": 1e-2})
    finish(start_sweep(argv, tmp_path / "sweep.log"), tmp_path / "sweep.log")
    first, second = trials_of(storage)
    assert first.state == optuna.trial.TrialState.COMPLETE and second.state == optuna.trial.TrialState.PRUNED
    folder = tmp_path / "sweeps" / "s"
    assert stages_recorded(folder / "trial_0") == 12 and stages_recorded(folder / "trial_1") < 12
    assert json.loads((folder / "trial_1" / TRIAL_RECORD).read_text())["state"] == "pruned"
    assert "interrupted" in (folder / "trial_1" / RUN_LOG).read_text()
    assert "| 1 | pruned |" in (folder / "summary.md").read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres():
    """A real PostgreSQL server on a free loopback port, in a temporary folder, as `nobody` when run as root
    (the server refuses root); its URL."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg (requirements-dev.txt) is not installed")
    tools = {name: shutil.which(name) or f"/usr/local/bin/{name}" for name in ("initdb", "pg_ctl", "postgres")}
    if not all(os.access(path, os.X_OK) for path in tools.values()):
        pytest.skip("PostgreSQL's initdb, pg_ctl and postgres are not installed")
    folder = Path(tempfile.mkdtemp(prefix="sweep-postgres-"))
    as_user = []
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
        as_user = ["runuser", "-u", "nobody", "--"]
    port = free_port()
    subprocess.run([*as_user, tools["initdb"], "-D", str(folder / "data"), "-U", "postgres", "--auth=trust"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, tools["pg_ctl"], "-D", str(folder / "data"), "-l", str(folder / "log"), "-w",
                    "-o", f"-p {port} -h 127.0.0.1 -k {folder}", "start"], check=True, capture_output=True)
    try:
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                             autocommit=True) as connection:
            connection.execute("CREATE DATABASE sweeps")
        yield f"postgresql://postgres@127.0.0.1:{port}/sweeps"
    finally:
        subprocess.run([*as_user, tools["pg_ctl"], "-D", str(folder / "data"), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_two_workers_share_a_postgresql_study(tmp_path, tiny_checkpoint, postgres):
    argv = sweep_flags(tmp_path, None, "s", 2, "--pruner", "none", "--storage", postgres) + \
        ["--", *base_flags(tiny_checkpoint, cycles=0)]
    workers = [start_sweep(argv, tmp_path / f"worker{i}.log") for i in range(2)]
    for i, worker in enumerate(workers):
        finish(worker, tmp_path / f"worker{i}.log")
    done = completed(trials_of(postgres))
    assert len(done) == 2 and len({t.user_attrs["folder"] for t in done}) == 2
