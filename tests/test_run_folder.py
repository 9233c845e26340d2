"""What a run leaves in its folder and says of its time (issue 59): a finished run drops its training state (last.*,
only --resume reads it) unless --keep_resume_state, says its folder's size and that it has finished when resumed;
--save_total_limit keeps earlier checkpoints, --resume_from continues one of them; every stage reports its
evaluation's seconds beside its training's, and the run's last line where its time went."""
import json
import re

import pytest

import multitask_classifier as mc
from conftest import DEMO, MAX_LENGTH, prediction_flags
from minbert.training.checkpoint_files import folder_size, human_size

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")

STATE = ("last.json", "last.safetensors")
THREE_STAGES = ("--cycle", "sst", "--cycles", "1")  # after run_flags' two


def run_flags(checkpoint, out, *extra) -> list[str]:
    """Two stages of 3 updates each (24 examples, batches of 8)."""
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--max_train_examples", "24", "--max_length", str(MAX_LENGTH), "--batch_size", "8",
            "--first_stages", "qqp,sts", "--cycles", "0", "--output_dir", str(out / "run"),
            *prediction_flags(out), *extra]


def checkpoints(run) -> list[str]:
    return sorted(path.name for path in run.glob("checkpoint-*"))


def test_a_finished_run_drops_its_training_state_and_says_its_folders_size(tiny_checkpoint, tmp_path, capsys):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path)) == 0
    run = tmp_path / "run"
    assert not any((run / name).exists() for name in STATE)
    assert (run / "best.safetensors").is_file()
    assert json.loads((run / "finished.json").read_text()) == {"stages": ["qqp", "sts"], "resume_state_kept": False}
    out = capsys.readouterr().out
    assert f"run folder {run}: {human_size(folder_size(run))} (its training state, " in out
    assert "removed: --keep_resume_state keeps it)" in out


def test_keep_resume_state_keeps_it_and_a_longer_schedule_continues_from_it(tiny_checkpoint, tmp_path):
    cycle = THREE_STAGES
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *cycle, "--keep_resume_state")) == 0
    assert all((tmp_path / "run" / name).is_file() for name in STATE)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *cycle, "--resume", "--cycles", "2")) == 0
    assert json.loads((tmp_path / "run" / "finished.json").read_text())["stages"] == ["qqp", "sts", "sst", "sst"]


def test_a_finished_run_resumed_says_it_has_finished_and_refuses_a_longer_schedule(tiny_checkpoint, tmp_path,
                                                                                    capsys):
    cycle = THREE_STAGES
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *cycle)) == 0
    metrics = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *cycle, "--resume")) == 0
    assert "the run has finished all its 3 stages; nothing to resume" in capsys.readouterr().out
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == metrics  # nothing trained again
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *cycle, "--resume", "--cycles", "2")) == 2
    err = capsys.readouterr().err
    assert "removed its training state" in err and "--keep_resume_state" in err and len(err.splitlines()) == 1


def test_save_total_limit_keeps_the_newest_checkpoints(tiny_checkpoint, tmp_path):
    # Saves after updates 1 and 2 inside each stage, and after each stage (3, 6): stopped after the second of three.
    stop = (*THREE_STAGES, "--save_steps", "1", "--stop_after_stages", "2")
    assert mc.main(run_flags(tiny_checkpoint, tmp_path / "one", *stop)) == 0
    assert checkpoints(tmp_path / "one" / "run") == []  # the default: last.* alone, as before
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *stop, "--save_total_limit", "3")) == 0
    run = tmp_path / "run"
    assert json.loads((run / "last.json").read_text())["updates"] == 6
    assert checkpoints(run) == ["checkpoint-4.json", "checkpoint-4.safetensors", "checkpoint-5.json",
                                "checkpoint-5.safetensors"]
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *THREE_STAGES, "--resume", "--save_total_limit", "3")) == 0
    assert checkpoints(run) == [] and not any((run / name).exists() for name in STATE)  # finished: all gone


def test_resume_from_a_chosen_checkpoint_ends_as_the_run_never_stopped(tiny_checkpoint, tmp_path, capsys):
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert mc.main(run_flags(tiny_checkpoint, straight, *THREE_STAGES)) == 0
    flags = (*THREE_STAGES, "--save_steps", "1", "--save_total_limit", "10")
    assert mc.main(run_flags(tiny_checkpoint, cut, *flags, "--stop_after_stages", "2")) == 0
    # After update 4 (inside the second stage): the save after it (5; last.* is 6) is removed, it becomes last.*.
    assert mc.main(run_flags(tiny_checkpoint, cut, *flags, "--resume_from", str(cut / "run" / "checkpoint-4.json"),
                             "--keep_resume_state")) == 0
    out = capsys.readouterr().out
    assert f"resuming from {cut / 'run' / 'checkpoint-4'}; the 1 checkpoint(s) saved after it are removed" in out
    assert "resuming inside stage 2 of 3: the checkpoint kept 1 of 3 updates of stage 2 sts" in out
    assert (cut / "run" / "best.safetensors").read_bytes() == (straight / "run" / "best.safetensors").read_bytes()
    assert [(cut / path.name).read_bytes() for path in straight.glob("*.csv")] == \
        [path.read_bytes() for path in straight.glob("*.csv")]
    # The continued run's saves follow the one it continued: 4 (inside stage 2), 5, 6 (after it), ..., 9 (last).
    assert checkpoints(cut / "run") == sorted(f"checkpoint-{n}.{suffix}" for n in range(1, 9)
                                              for suffix in ("json", "safetensors"))


@pytest.mark.parametrize("chosen", ["elsewhere/checkpoint-4", "run/best", "run/checkpoint-9"])
def test_resume_from_refuses_what_is_not_one_of_the_runs_checkpoints(tiny_checkpoint, tmp_path, capsys, chosen):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--save_steps", "1", "--save_total_limit", "10",
                             "--stop_after_stages", "1")) == 0
    (tmp_path / "elsewhere").mkdir()
    capsys.readouterr()
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--resume_from", str(tmp_path / chosen))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --resume_from {tmp_path / chosen}: ") and len(err.splitlines()) == 1


def test_each_stage_reports_its_evaluation_seconds_and_the_run_where_its_time_went(tiny_checkpoint, tmp_path,
                                                                                     capsys):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path)) == 0
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    stages = [record for record in history if record["index"] > 0]
    assert all(record["eval_seconds"] > 0 and record["seconds"] > 0 for record in stages)
    out = capsys.readouterr().out
    assert re.search(r"\| stage sts \| train_loss [\d.]+ \| seconds [\d.]+ \| eval_seconds [\d.]+ \|", out)
    summary = re.search(r"^time: ([\d.]+) s, training ([\d.]+) s, evaluation ([\d.]+) s, checkpoints ([\d.]+) s, "
                        r"other (-?[\d.]+) s \(loading, predictions, reports\)$", out, re.MULTILINE)
    total, training, evaluation, saving, other = map(float, summary.groups())
    assert training >= sum(record["seconds"] for record in stages) - 0.2 and evaluation > 0 and saving > 0
    assert total == pytest.approx(training + evaluation + saving + other, abs=0.25)
