"""The step loop has one owner (minbert/training/loop.py): the run's progress is one TrainingState that the checkpoint
saves and --resume restores whole, what follows an update is decided in TrainerControl flags the loop reads, the loop
saves its checkpoints itself, and the trainer writes none of the loop's fields."""
import ast

import pytest
import torch

from conftest import ROOT
from minbert.training.loop import StepLoop
from minbert.training.schedules import Stage, StageKind
from minbert.training.training_state import read_training_state
from test_trainer import demo_data, make_trainer

pytestmark = pytest.mark.usefixtures("one_thread")


class Killed(BaseException):
    """The process dying as an update begins: nothing after it runs."""


def killed_at(trainer, updates: int) -> None:
    original = trainer.loop.optimizer_step

    def optimizer_step(*args, **kwargs):
        if trainer.state.updates == updates:
            raise Killed
        return original(*args, **kwargs)
    trainer.loop.optimizer_step = optimizer_step


def test_a_checkpoint_inside_a_stage_restores_the_state_it_saved(tmp_path, tokenizer):
    """Resumed, then saved again before any step: the same tensors and the same last.json (but for the clock), so
    the state holds all the checkpoint says of the run's progress: updates, the stage's place, its losses so far,
    steps.jsonl's sums since its last line."""
    settings = dict(smart=True, smart_tasks="sst", save_steps=2, logging_steps=3)
    stopped = make_trainer(tmp_path, tokenizer, **settings)
    killed_at(stopped, 3)
    with pytest.raises(Killed):
        stopped.train([Stage(StageKind.TASK, "sst")])
    saved_tensors, saved = read_training_state(tmp_path / "run" / "last")
    resumed = make_trainer(tmp_path, tokenizer, **settings)
    resumed.load_state_dict(saved_tensors, saved)
    stage = resumed.state.stage
    assert (resumed.state.updates, stage.index, stage.steps_done, stage.losses.count) == (2, 0, 2, 2)
    assert resumed.state.penalty_terms.counts  # SMART's terms since the line of steps.jsonl before
    resumed.loop.save(stage, "stage 1 sst")
    tensors, again = read_training_state(tmp_path / "run" / "last")
    assert sorted(tensors) == sorted(saved_tensors)
    assert all(torch.equal(tensors[name], saved_tensors[name]) for name in tensors)
    assert again["position"].pop("seconds") >= saved["position"].pop("seconds")  # the clock goes on
    assert again == saved


def test_the_loop_decides_when_to_log_save_and_end_the_stage(tmp_path, tokenizer, monkeypatch):
    """Six updates, a line every 2, a checkpoint every 3: lines after 2, 4 and 6; a checkpoint
    after 3, not after 6, the stage's last (the stage's own follows its dev pass)."""
    trainer = make_trainer(tmp_path, tokenizer, data=demo_data(train=24), logging_steps=2, save_steps=3)
    decided, saves = [], []
    decide_save = trainer.loop.decide_save

    def recording(stage, control):
        control = decide_save(stage, control)
        decided.append((trainer.state.updates, control.should_log, control.should_save, control.should_evaluate))
        return control
    monkeypatch.setattr(trainer.loop, "decide_save", recording)
    monkeypatch.setattr(trainer.loop.checkpoint, "save", lambda state, position=None, local=None: saves.append(
        (state.updates, position["steps_done"])))
    batches = trainer.stage_data.task_batches(Stage(StageKind.TASK, "sst"), 0, 0)
    progress = trainer.loop.stage_progress(0, Stage(StageKind.TASK, "sst"), 6, 1e-3)
    trainer.loop.run_steps(([("sst", b)] for b in batches), 6, "stage 1 sst", stage=progress)
    assert [d[1] for d in decided] == [False, True, False, True, False, True]
    assert [d[2] for d in decided] == [False, False, True, False, False, False]
    assert [d[3] for d in decided] == [False] * 5 + [True]
    assert saves == [(3, 3)] and trainer.state.stage is None  # the loop saved, with the stage's place


def test_steps_outside_a_schedule_never_save_inside_and_stop_after_stages_stops(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, save_steps=1, stop_after_stages=2)
    batches = list(trainer.stage_data.task_batches(Stage(StageKind.TASK, "sst"), 0, 0))[:3]
    trainer.loop.run_steps(([("sst", b)] for b in batches), 3, "test")
    assert trainer.state.updates == 3 and not (tmp_path / "run" / "last.json").exists()
    assert [trainer.loop.decide_stage(index).should_stop for index in range(4)] == [False, False, True, True]
    assert trainer.loop.control.should_stop  # the flag the trainer reads


def loop_fields_written(source: str) -> list[str]:
    """Assignments in `source` to a field of the trainer's step loop or the parts it shares (self.loop.X, self.parts.X)."""
    written = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                text = ast.unparse(element)
                if text.startswith(("self.loop.", "self.parts.")):
                    written.append(text)
    return written


def test_the_trainer_writes_no_field_of_its_step_loop():
    assert loop_fields_written((ROOT / "minbert" / "training" / "trainer.py").read_text()) == []
    assert loop_fields_written("self.loop.stage_lr = 1\nself.loop.state, x = 1, 2\nself.parts.n += 1\n") == [
        "self.loop.stage_lr", "self.loop.state", "self.parts.n"]


def test_the_step_loop_takes_no_callback_from_its_caller():
    """StepLoop's constructor takes objects, none a function back into the trainer (a save callback was one)."""
    source = ast.parse((ROOT / "minbert" / "training" / "loop.py").read_text())
    init = next(node for node in ast.walk(source) if isinstance(node, ast.ClassDef) and node.name == "StepLoop").body
    init = next(node for node in init if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    assert not [arg.arg for arg in init.args.args if arg.annotation is not None
                and "Callable" in ast.unparse(arg.annotation)]


def test_no_function_hands_state_between_the_trainer_and_its_loop():
    """The step reads the loop's own state: neither the trainer nor the loop builds a lambda (the trainer once handed
    `lambda: self.loop.state` to the batch steps, which read the state through it)."""
    for name in ("trainer.py", "loop.py"):
        source = ast.parse((ROOT / "minbert" / "training" / name).read_text())
        assert not [node.lineno for node in ast.walk(source) if isinstance(node, ast.Lambda)], name
