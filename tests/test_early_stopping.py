"""--patience K (issue 37, item 6): a multi-epoch stage stops repeating after K epochs without a better dev score of
its task, decided from the run's history, so that a resumed run decides as an uninterrupted one."""
import json

import pytest

import multitask_classifier as mc
from conftest import DEMO, exit_code, prediction_flags, skip_figures
from minbert.training.schedules import Stage, StageKind, build_schedule, multi_epoch_stages, patience_exhausted
from minbert.training.trainer import Trainer

# sts_pearson on dev by the number of records in the history when it is measured: the pretrained model, sst, then
# six sts epochs (the 3rd and 4th below the 2nd: patience 2 runs out after the 4th) and qqp
STS_DEV = {0: 0.1, 1: 0.2, 2: 0.5, 3: 0.6, 4: 0.55, 5: 0.58, 6: 0.9, 7: 0.95}


def test_multi_epoch_stages_are_runs_of_equal_task_stages_or_multitask_epochs():
    stages = build_schedule("sequential", "qqp,sts*3,sst,sts:0.5*2", "sts,sst", 1, mlm_epochs=2)
    groups = multi_epoch_stages(stages)
    assert [s.label for s in stages] == ["mlm", "mlm", "qqp", "sts", "sts", "sts", "sst", "sts@0.5", "sts@0.5",
                                         "sts", "sst"]
    assert groups == [None, None, None, range(3, 6), range(3, 6), range(3, 6), None, range(7, 9), range(7, 9),
                      None, None]  # mlm epochs have no dev metric of their own; sts@0.5 is other data than sts
    assert multi_epoch_stages(build_schedule("annealed", epochs=3, simcse_epochs=1)) == [None] + [range(1, 4)] * 3
    assert multi_epoch_stages([Stage(StageKind.TASK, "sts")]) == [None]


@pytest.mark.parametrize("scores, patience, exhausted", [
    ([0.5, 0.6, 0.55, 0.58], 2, True),   # two epochs below the best before them
    ([0.5, 0.6, 0.55], 2, False),        # only one so far
    ([0.5, 0.6, 0.55, 0.61], 2, False),  # the last one improved
    ([0.5, 0.4], 1, True),               # the first epoch did not beat the model it started from
    ([0.5, 0.6, 0.6], 1, True),          # a tie is no improvement
])
def test_patience_exhausted(scores, patience, exhausted):
    assert patience_exhausted(scores, patience) is exhausted


def scripted_sts(monkeypatch):
    """The history's records report STS_DEV's sts_pearson (the rest as measured), so that the decisions are known:
    each record is changed in place as it is logged, before the kept model and early stopping read it."""
    log = Trainer.log

    def scripted(self, record):
        if len(self.state.history) in STS_DEV:
            record["sts_pearson"] = STS_DEV[len(self.state.history)]
        log(self, record)
    monkeypatch.setattr(Trainer, "log", scripted)


def flags(checkpoint, out, *extra) -> list[str]:
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--first_stages",
            "sst,sts*6,qqp", "--cycles", "0", "--patience", "2", "--keep_resume_state",
            "--output_dir", str(out / "run"),
            *prediction_flags(out), *extra]


def stages_run(out) -> list[tuple[int, str]]:
    return [(r["index"], r["stage"]) for r in map(json.loads, (out / "run" / "metrics.jsonl").read_text().splitlines())]


@pytest.fixture(scope="module")
def uninterrupted(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("patience")
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        scripted_sts(patch)
        assert mc.main(flags(tiny_checkpoint, out)) == 0
    return out


def test_a_multi_epoch_stage_stops_after_patience_epochs_without_improving(uninterrupted, capsys):
    # sts epochs 3 and 4 (stages 5 and 6) did not beat epoch 2's 0.6: stages 7 and 8 are skipped, qqp still runs
    assert stages_run(uninterrupted) == [(0, "pretrained"), (1, "sst"), (2, "sts"), (3, "sts"), (4, "sts"),
                                         (5, "sts"), (8, "qqp")]
    last = json.loads((uninterrupted / "run" / "last.json").read_text())
    assert last["skipped_stages"] == [5, 6] and last["next_stage"] == 8


@pytest.mark.parametrize("stop_after", [4, 5])  # before the decision, and after it (the skip is in last.json)
def test_a_resumed_run_stops_early_as_an_uninterrupted_one(uninterrupted, tiny_checkpoint, tmp_path, monkeypatch,
                                                          stop_after):
    skip_figures(monkeypatch)
    scripted_sts(monkeypatch)
    assert mc.main(flags(tiny_checkpoint, tmp_path, "--stop_after_stages", str(stop_after))) == 0
    assert mc.main(flags(tiny_checkpoint, tmp_path, "--resume")) == 0
    assert stages_run(tmp_path) == stages_run(uninterrupted)
    for name in ("sst-dev-out.csv", "para-test-out.csv", "sts-dev-out.csv"):
        assert (tmp_path / name).read_bytes() == (uninterrupted / name).read_bytes()


@pytest.mark.parametrize("edit, problem", [
    ({"skipped_stages": [9]}, "skipped_stages [9] must be distinct stage positions below next_stage"),
    ({"skipped_stages": [6, 5]}, "skipped_stages [6, 5] must be distinct"),
    ({"skipped_stages": [5]}, "history record 6 must be an object with a 'stage' name and 'index' 7"),
    ({"next_stage": 9}, "next_stage 9 does not follow the history's 6 stage(s) done and the 2 early stopping skipped"),
])
def test_a_hand_edited_skipped_stages_is_one_clear_line(uninterrupted, tiny_checkpoint, tmp_path, capsys, edit,
                                                        problem):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("last.json", "last.safetensors", "best.json", "best.safetensors"):
        (run / name).write_bytes((uninterrupted / "run" / name).read_bytes())
    info = run / "last.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), **edit}))
    capsys.readouterr()
    assert exit_code(flags(tiny_checkpoint, tmp_path, "--resume")) == 2
    assert problem in capsys.readouterr().err


def test_patience_must_be_at_least_one(capsys):
    assert exit_code(["--patience", "0"]) == 2
    assert "--patience must be >= 1, got 0" in capsys.readouterr().err
