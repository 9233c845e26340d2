"""The modules one training step opens, as docs/layout.md lists them ("One training step, module by module"), traced:
a real step of a tiny run, its batch drawn, its update taken, its line of steps.jsonl written and its checkpoint
saved, executes the project modules the doc names and no other (issue 58). The test reads the doc's list, so the doc
cannot drift from the code."""
import re
import sys
from pathlib import Path

from test_trainer import demo_data, make_trainer

from minbert.training.schedules import Stage, StageKind

ROOT = Path(__file__).resolve().parents[1]


def documented_modules(kind: str) -> list[str]:
    """The modules docs/layout.md lists for a step of `kind` ("plain", "SMART"): the backquoted paths of its item
    "- A <kind> step executes: ...", which runs to the next item or a blank line."""
    text = (ROOT / "docs" / "layout.md").read_text()
    item = re.search(rf"^- A {kind} step executes: (.*?)(?=^- |\n\n)", text, re.M | re.S)
    assert item, f"docs/layout.md lists no modules for a {kind} step"
    return sorted(set(re.findall(r"`([^`]+\.py)`", item.group(1))))


def executed_modules(trainer) -> list[str]:
    """The project files (the repository's, tests aside) whose code runs while the trainer's step loop trains a
    stage of one step: the batch, the forward, the loss and penalties, the backward, the update, the log line, the
    checkpoint inside the stage."""
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(ROOT) and path.parts[len(ROOT.parts)] != "tests":
                seen.add(path.relative_to(ROOT).as_posix())
    stage = Stage(StageKind.TASK, "sst")
    sys.setprofile(profile)
    try:
        trainer.loop.run_steps(([("sst", batch)] for batch in trainer.stage_data.task_batches(stage, 0, 0)), 2,
                               "stage 1 sst", stage=trainer.loop.stage_progress(0, stage, 2, trainer.config.lr))
    finally:
        sys.setprofile(None)
    return sorted(seen)


def one_step_trainer(tmp_path, tokenizer, **settings):
    """Two steps (the first's update, line and checkpoint are traced; the second ends the stage)."""
    return make_trainer(tmp_path, tokenizer, data=demo_data(train=8), logging_steps=1, save_steps=1, **settings)


def test_a_plain_step_executes_the_modules_the_layout_lists(tmp_path, tokenizer):
    assert executed_modules(one_step_trainer(tmp_path, tokenizer)) == documented_modules("plain")


def test_a_smart_step_executes_the_modules_the_layout_lists(tmp_path, tokenizer):
    trainer = one_step_trainer(tmp_path, tokenizer, smart=True)
    assert executed_modules(trainer) == documented_modules("SMART")


def test_the_list_is_read_from_the_doc():
    assert "minbert/training/loop.py" in documented_modules("plain")
