"""A damaged or hand-edited training state (OUTPUT_DIR/last.json) is refused in one line naming the file and the field
and what is wrong with it, exit code 2: never blamed on the flags (the resume has checked them equal), never a
traceback, never a resume that trains on with other numbers."""
import json

import pytest

import multitask_classifier as mc
from test_mid_stage_resume import ANNEALED, Killed, killed_after
from test_mid_stage_resume import run_flags as mid_stage_flags
from test_resume_free_flags import STAGES, run_flags

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")


def resumed_after_edit(argv, tmp_path, capsys, edit) -> str:
    """The one line of a resume of the run stopped in tmp_path/run, its last.json edited by `edit` (in place)."""
    info = tmp_path / "run" / "last.json"
    metadata = json.loads(info.read_text())
    edit(metadata)
    info.write_text(json.dumps(metadata))
    capsys.readouterr()
    assert mc.main([*argv, "--resume"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {info}"), lines
    assert "differ from the stopped run" not in lines[0] and "with these flags" not in lines[0]  # not the flags' fault
    return lines[0]


def set_block_best(metadata):
    metadata["block_best"] = {"index": 1, "score": 0.5}  # and no tensors of it in last.safetensors


@pytest.mark.parametrize("edit, problem", [
    (lambda m: m["rng"]["python"].__setitem__(1, m["rng"]["python"][1][:-1]),
     "rng.python is not a python generator state (ValueError: state vector is the wrong size)"),
    (lambda m: m["rng"]["numpy"].__setitem__(2, 700), "rng.numpy is not a numpy generator state"),
    (lambda m: m["rng"].pop("numpy"), "rng.numpy is not a numpy generator state (KeyError"),
    (lambda m: m["optimizer"]["steps"].__setitem__("0", 0), "optimizer.steps['0'] must be"),
    (lambda m: m["optimizer"]["steps"].__setitem__("0", m["updates"] + 1), "optimizer.steps['0'] must be"),
    (lambda m: m["optimizer"].pop("param_groups"), "optimizer must hold 'steps'"),
    (lambda m: m["optimizer"]["param_groups"][1].__setitem__("weight_decay", 0.5),
     "optimizer.param_groups[1] weight_decay 0.5 is not the 0.0 the run's flags give"),
    (lambda m: m.__setitem__("grad_scaler", {"scale": -1.0}), "grad_scaler {'scale': -1.0} must hold finite numbers"),
    (set_block_best, "block_best names stage 1, but the tensors kept of it (0) are not the model's trained ones"),
])
def test_a_damaged_training_state_names_the_file_and_the_field(tiny_checkpoint, tmp_path, capsys, edit, problem):
    argv = run_flags(tiny_checkpoint, tmp_path, *STAGES, "--quiet")
    assert mc.main([*argv, "--stop_after_stages", "1"]) == 0
    assert problem in resumed_after_edit(argv, tmp_path, capsys, edit)


@pytest.mark.parametrize("edit, problem", [
    (lambda p: p["rng"].__setitem__(1, p["rng"][1][:10]), "the position's rng is not a Python generator state"),
    (lambda p: p["loaders"].__setitem__("sst", [0, -1]), "the position's loaders must give each task two whole"),
    (lambda p: p["loaders"].__setitem__("qa", [0, 1]), "the position's loaders name tasks this run does not have (qa)"),
])
def test_a_damaged_place_in_a_multitask_epoch_names_the_file_and_the_field(tiny_checkpoint, tmp_path, monkeypatch,
                                                                          capsys, edit, problem):
    """A checkpoint inside an annealed epoch keeps where each task's loader and the task order's generator stood;
    damaged, they failed with a traceback when the epoch began again."""
    argv = mid_stage_flags(tiny_checkpoint, tmp_path, *ANNEALED, "--save_steps", "2")
    killed_after(monkeypatch, 5)
    with pytest.raises(Killed):
        mc.main(argv)
    monkeypatch.undo()
    assert problem in resumed_after_edit(argv, tmp_path, capsys, lambda m: edit(m["position"]))
