"""distillation.py and each task's distillation loss: the losses on hand-made tensors, the teacher's scores by id,
and --score_train / --distill through the command line on the demo data with a tiny BERT (SQuAD's window logits
too)."""
import json
import math
import re
import shutil
from types import SimpleNamespace

import ensemble
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.numpy import save

import multitask_classifier as mc
from conftest import DEMO, exit_code, prediction_flags, skip_figures
from minbert.data.scores import ScoresFileError, read_scores, scores_path, span_logits_path, write_scores
from minbert.prediction.ensemble_scores import teacher_scores
from minbert.tasks import TASKS
from minbert.tasks.losses import (SIMILARITY_OBJECTIVES, ClassificationObjective, CosineSimilarityObjective,
                                  CrossSimilarityObjective)
from minbert.tasks.qa import PADDING_LOGIT, read_span_logits, write_span_logits
from minbert.tasks.score_files import file_sha256, train_record_path
from minbert.training.distillation import Distillation, TeacherScores, TeacherSpans, load_teacher

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")


def random_scores(task: str, n: int = 6, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if task == "sst":
        return torch.randn(n, 5, generator=generator) * 2
    if task == "qqp":
        return torch.randn(n, generator=generator) * 3
    if task == "qa":  # (B, T, 2) window logits; the first window is 4 tokens long, the rest padding
        logits = torch.randn(n, 7, 2, generator=generator) * 3
        logits[0, 4:] = PADDING_LOGIT
        return logits
    return torch.rand(n, generator=generator) * 5


# ---------------------------------------------------------------------------------------------------
# The losses

# Scores as they are: what a task's distillation_loss compares (SST's, QQP's and SQuAD's objective score, STS's
# unclamped score, on the cosine objective's scale 5).
AS_SCORED = SimpleNamespace(score=lambda outputs: outputs, unclamped_score=lambda outputs: outputs, score_scale=5.0)


def distillation_loss(task: str, student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0):
    """The task's distillation loss of a student's scores against a teacher's (looked up by no id here)."""
    return TASKS[task].model.distillation_loss(AS_SCORED, student, SimpleNamespace(of=lambda ids, like: teacher), [],
                                         temperature)


@pytest.mark.parametrize("task", ["sst", "qqp", "sts", "qa"])
def test_the_loss_is_zero_where_student_and_teacher_agree_and_positive_elsewhere(task):
    teacher = random_scores(task)
    assert distillation_loss(task, teacher.clone(), teacher, temperature=1.0).item() == pytest.approx(0, abs=1e-6)
    assert distillation_loss(task, random_scores(task, seed=1), teacher).item() > 1e-3


def test_sst_is_the_kl_of_the_softened_distributions_times_t_squared():
    student, teacher = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 2.0, 0.0, 0.0]])
    for temperature in (1.0, 2.0):
        p = torch.softmax(teacher / temperature, -1)[0]
        q = torch.softmax(student / temperature, -1)[0]
        expected = float((p * (p / q).log()).sum()) * temperature ** 2
        assert distillation_loss("sst", student, teacher, temperature).item() == pytest.approx(expected, rel=1e-5)


def test_qqp_is_the_kl_of_two_bernoullis_with_the_gradient_of_bce_on_soft_labels():
    student, teacher = torch.tensor([0.5, -2.0], requires_grad=True), torch.tensor([2.0, 1.0])
    p, q = torch.sigmoid(teacher), torch.sigmoid(student.detach())
    expected = (p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()).mean()
    loss = distillation_loss("qqp", student, teacher)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert torch.allclose(student.grad, (q - p) / 2)  # what BCE on the teacher's probability gives


def test_sts_is_the_squared_error_of_the_0_to_5_scores_on_the_gold_loss_scale():
    student, teacher = torch.tensor([1.0, 4.0]), torch.tensor([2.0, 2.0])
    assert distillation_loss("sts", student, teacher).item() == pytest.approx((1 + 4) / 2 / 25)


def test_qa_is_the_mean_kl_of_the_start_and_end_distributions_and_padding_weighs_nothing():
    teacher, student = random_scores("qa", n=2), random_scores("qa", n=2, seed=1)
    student[0, 4:] = PADDING_LOGIT  # both windows padded alike
    temperature = 2.0
    expected = 0.0
    for row in range(2):
        for end in range(2):
            p = torch.softmax(teacher[row, :, end] / temperature, -1)
            q = torch.softmax(student[row, :, end] / temperature, -1)
            expected += float((p * (p / q).log()).nansum()) / 4
    loss = distillation_loss("qa", student, teacher, temperature)
    assert loss.item() == pytest.approx(expected * temperature ** 2, rel=1e-5)
    # The first window's padding has no probability on either side: scores there change nothing.
    moved = student.clone()
    moved[0, 4:] = PADDING_LOGIT - 5
    assert distillation_loss("qa", moved, teacher, temperature).item() == pytest.approx(loss.item(), rel=1e-6)


@pytest.mark.parametrize("name", SIMILARITY_OBJECTIVES)
def test_sts_distillation_is_on_each_objectives_gold_scale_and_unclamped(name):
    objective = CosineSimilarityObjective(name)
    teacher = TeacherScores({"a": 0, "b": 1}, np.array([[1.0], [3.0]]))
    cosine = torch.tensor([-0.4, 0.2], requires_grad=True)
    loss = Distillation({"sts": teacher}, weight=1.0).mix("sts", torch.tensor(0.0), objective, cosine, ["a", "b"])
    # the teacher's score put in place of the label of the regression the gold loss fits
    targets = torch.tensor([1.0, 3.0]) / 5 if name == "cosine" else (torch.tensor([1.0, 3.0]) - 2.5) / 2.5
    assert loss.item() == pytest.approx(F.mse_loss(cosine, targets).item(), rel=1e-6)
    loss.backward()
    assert cosine.grad[0] != 0  # a negative cosine (scored 0 by cosine's clamp) still learns from the teacher
    cross = CrossSimilarityObjective()
    logits = torch.tensor([-1.0, 2.0])
    loss = Distillation({"sts": teacher}, weight=1.0).mix("sts", torch.tensor(0.0), cross, logits, ["a", "b"])
    assert loss.item() == pytest.approx(cross.loss(logits, torch.tensor([1.0, 3.0])).item(), rel=1e-6)


def test_mix_weighs_gold_and_teacher_and_leaves_other_tasks_alone():
    teacher = TeacherScores({"a": 1, "b": 0}, np.array([[3.0], [1.0]]))
    distillation = Distillation({"sts": teacher}, weight=0.25)
    gold, cosine, objective = torch.tensor(0.4), torch.tensor([0.6, 0.6]), CosineSimilarityObjective()
    expected = 0.75 * 0.4 + 0.25 * F.mse_loss(5 * cosine, torch.tensor([1.0, 3.0])).item() / 25
    assert distillation.mix("sts", gold, objective, cosine, ["b", "a"]).item() == pytest.approx(expected)
    assert distillation.mix("sst", gold, ClassificationObjective(), torch.zeros(2, 5), ["b", "a"]) is gold
    for weight, temperature in ((0.0, 1.0), (1.5, 1.0), (0.5, 0.0), (math.nan, 1.0)):
        with pytest.raises(ValueError):
            Distillation({}, weight, temperature)
        with pytest.raises(ValueError):
            Distillation({}, per_task={"sst": (weight, temperature)})


def test_a_task_may_have_its_own_weight_and_temperature():
    teacher = TeacherScores({"a": 0}, np.array([[0.0, 0.0, 3.0, 0.0, 0.0]]))
    student, gold = torch.zeros(1, 5), torch.tensor(0.7)
    distillation = Distillation({"sst": teacher}, weight=0.5, temperature=1.0, per_task={"sst": (1.0, 2.0)})
    expected = distillation_loss("sst", student, torch.tensor([[0.0, 0.0, 3.0, 0.0, 0.0]]), temperature=2.0)
    assert distillation.mix("sst", gold, ClassificationObjective(), student, ["a"]).item() == pytest.approx(
        expected.item())  # no gold left
    assert distillation.setting("qqp") == (0.5, 1.0)


# ---------------------------------------------------------------------------------------------------
# The teacher's scores


def test_the_teacher_is_read_by_id_whatever_its_row_order(tmp_path):
    write_scores(scores_path(tmp_path, "sst", "train"), ["x", "y", "z"], np.arange(15.0).reshape(3, 5), "sst")
    teacher = load_teacher(tmp_path, {"sst": ["z", "x"]})
    assert teacher["sst"].of(["z", "x"], torch.zeros(2, 5)).tolist() == [[10, 11, 12, 13, 14], [0, 1, 2, 3, 4]]


def windows(max_length: int, doc_stride: int) -> dict:
    """A student's task settings (tasks.task_settings) that cut SQuAD's windows so."""
    return {"qa_max_length": max_length, "qa_doc_stride": doc_stride}


def test_squad_window_logits_read_back_exact_and_are_padded_as_the_students_batch(tmp_path):
    path = span_logits_path(tmp_path)
    logits = [np.arange(6.0).reshape(3, 2), np.full((2, 2), -0.5), np.ones((4, 2))]
    write_span_logits(path, ["q1#0", "q1#1", "q2#0"], logits, max_length=48, doc_stride=16)
    spans = read_span_logits(path)
    assert (spans.ids, spans.max_length, spans.doc_stride) == (["q1#0", "q1#1", "q2#0"], 48, 16)
    assert all(np.array_equal(a, b) for a, b in zip(spans.logits, logits))
    write_span_logits(tmp_path / "again.safetensors", spans.ids, spans.logits, 48, 16)
    assert (tmp_path / "again.safetensors").read_bytes() == path.read_bytes()
    teacher = load_teacher(tmp_path, {"qa": ["q2", "q1"]}, windows(48, 16))["qa"]
    target = teacher.of(["q1#1", "q1#0"], torch.zeros(2, 5, 2))  # a batch padded to 5 tokens
    assert target[0, :2].tolist() == [[-0.5, -0.5]] * 2 and target[1, :3].tolist() == logits[0].tolist()
    assert (target[0, 2:] == PADDING_LOGIT).all() and (target[1, 3:] == PADDING_LOGIT).all()


def test_a_squad_teacher_whose_windows_are_cut_otherwise_is_refused(tmp_path):
    """Same question ids and windowing flags, but another tokenizer: the token counts tell."""
    teacher = TeacherSpans({"q1#0": np.zeros((5, 2)), "q1#1": np.zeros((4, 2))}, tmp_path / "qa-train.safetensors")
    teacher.check_windows(Windows(["q1#0", "q1#1"], [5, 4]))
    with pytest.raises(ScoresFileError, match="window q1#1 has 4 tokens, this run's 6: another tokenizer"):
        teacher.check_windows(Windows(["q1#0", "q1#1"], [5, 6]))
    with pytest.raises(ScoresFileError, match="no teacher logits for the training window q1#2"):
        teacher.check_windows(Windows(["q1#0", "q1#1", "q1#2"], [5, 4, 3]))


class Windows(list):
    """What check_windows reads of squad.QAWindows: its windows' ids, in order, and their lengths."""
    def __init__(self, ids, lengths):
        super().__init__(SimpleNamespace(id=i) for i in ids)
        self.lengths = lengths


def test_squad_teachers_that_do_not_fit_are_refused(tmp_path):
    with pytest.raises(ScoresFileError, match="no SQuAD train logits for --distill"):
        load_teacher(tmp_path, {"qa": ["q1"]}, windows(48, 16))
    path = span_logits_path(tmp_path)
    write_span_logits(path, ["q1#0"], [np.zeros((3, 2))], max_length=48, doc_stride=16)
    with pytest.raises(ScoresFileError, match="windows of 48 tokens with stride 16, this run cuts 64 with stride 16"):
        load_teacher(tmp_path, {"qa": ["q1"]}, windows(64, 16))
    with pytest.raises(ScoresFileError, match=r"no teacher logits for 1 of the 2 qa training questions \(e.g. id q2\)"):
        load_teacher(tmp_path, {"qa": ["q1", "q2"]}, windows(48, 16))
    path.write_bytes(path.read_bytes()[:-4])  # cut short
    with pytest.raises(ScoresFileError, match="not a SQuAD train-logits file"):
        load_teacher(tmp_path, {"qa": ["q1"]}, windows(48, 16))
    write_span_logits(path, ["q1#0"], [np.array([[0.0, math.inf]])], 48, 16)
    with pytest.raises(ScoresFileError, match="not finite"):
        read_span_logits(path)
    for ids in ([7], [["q1#0"]]):  # window ids that are not strings: a number, a list
        write_span_logits(path, ids, [np.zeros((3, 2))], 48, 16)
        with pytest.raises(ScoresFileError, match="window ids do not fit"):
            read_span_logits(path)


@pytest.mark.parametrize("task, rows, problem", [
    ("sts", [6.5], "STS score 6.5 is outside 0-5"),
    ("sts", [-1e20], "STS score -1e+20 is outside 0-5"),
    ("qqp", [1e39], "a logit beyond +-10000 (1e+39)"),  # float32 inf: the loss was inf, exit 0
    ("sst", [[0, 0, 0, 0, -2e4]], "a logit beyond +-10000 (-20000)"),
])
def test_teacher_scores_outside_what_the_objective_takes_are_refused(tmp_path, task, rows, problem):
    path = scores_path(tmp_path, task, "train")
    write_scores(path, ["a"], np.array(rows, dtype=np.float64), task)
    with pytest.raises(ScoresFileError, match=re.escape(f"{path}, line 2: {problem}")):
        load_teacher(tmp_path, {task: ["a"]})


def test_sts_scores_at_the_ends_of_the_scale_are_read_with_float32_rounding(tmp_path):
    path = scores_path(tmp_path, "sts", "train")
    write_scores(path, ["a", "b"], np.array([5.00000024, 0.0]), "sts")  # 2.5 cos + 2.5 with cos 1 + 1e-7
    assert read_scores(path, "sts")[1].tolist() == [5.00000024, 0.0]


def test_squad_teacher_logits_out_of_range_or_lengths_that_are_not_integers_are_refused(tmp_path):
    path = span_logits_path(tmp_path)
    write_span_logits(path, ["q1#0"], [np.array([[0.0, 3e4], [0.0, 0.0]])], 48, 16)
    with pytest.raises(ScoresFileError, match=r"a logit beyond \+-10000 \(30000\)"):
        read_span_logits(path)
    windows = json.dumps({"ids": ["q1#0"], "max_length": 48, "doc_stride": 16})
    path.write_bytes(save({"logits": np.zeros((2, 2), np.float32), "lengths": np.array([2.0])},
                          metadata={"windows": windows}))
    with pytest.raises(ScoresFileError, match="the window lengths must be integers, found float64"):
        read_span_logits(path)


def test_a_distill_teacher_that_is_a_file_is_named_as_such(tmp_path):
    teacher = tmp_path / "teacher.csv"
    teacher.write_text("id,logit\n")
    with pytest.raises(ScoresFileError, match="teacher.csv: not a folder; --distill names a teacher's folder"):
        load_teacher(teacher, {"qqp": ["a"]})


def test_a_teacher_without_train_scores_or_missing_an_id_is_refused(tmp_path):
    with pytest.raises(ScoresFileError, match="no train scores for --distill.*--score_train"):
        load_teacher(tmp_path, {"qqp": ["a"]})
    write_scores(scores_path(tmp_path, "qqp", "train"), ["a", "b"], np.array([0.5, -1.0]), "qqp")
    with pytest.raises(ScoresFileError, match=r"qqp-train.csv: no teacher score for 1 of the 3 qqp training "
                                              r"examples \(e.g. id c\)"):
        load_teacher(tmp_path, {"qqp": ["a", "b", "c"]})


# ---------------------------------------------------------------------------------------------------
# Through the command line


def run_flags(checkpoint, out, *extra) -> list[str]:
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--first_stages", "sst,qqp,sts",
            "--cycles", "0", "--output_dir", str(out / "run"), *prediction_flags(out), *extra]


@pytest.fixture(scope="module")
def teacher_run(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher")
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert mc.main(run_flags(tiny_checkpoint, out, "--score_train")) == 0
    return out / "run"


def test_score_train_writes_every_trained_split_and_reads_back_byte_exact(teacher_run, tmp_path):
    for task in ("sst", "qqp", "sts"):
        path = scores_path(teacher_run, task, "train")
        ids, scores = read_scores(path, task)
        assert len(ids) == 16
        write_scores(tmp_path / path.name, ids, scores, task)
        assert (tmp_path / path.name).read_bytes() == path.read_bytes()
    dev_ids, dev_scores = read_scores(scores_path(teacher_run, "sst", "dev"), "sst")
    assert len(dev_ids) == 40 and dev_scores.shape == (40, 5)


def test_a_finished_run_becomes_a_teacher_with_resume_and_score_train(teacher_run, tiny_checkpoint, tmp_path):
    """--score_train may be added on --resume: a finished run then only scores its train splits, as if it had
    been given the flag from the start."""
    assert mc.main(run_flags(tiny_checkpoint, tmp_path)) == 0
    history = (tmp_path / "run" / "history.json").read_bytes()
    assert not scores_path(tmp_path / "run", "sst", "train").exists()
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--resume", "--score_train")) == 0
    assert (tmp_path / "run" / "history.json").read_bytes() == history  # nothing trained again
    for task in ("sst", "qqp", "sts"):
        assert (scores_path(tmp_path / "run", task, "train").read_bytes()
                == scores_path(teacher_run, task, "train").read_bytes())
    assert_records_its_train_scores(tmp_path / "run")


def assert_records_its_train_scores(run):
    """scores/train.json ties each train scores file to the run's kept weights (best.json's sha256)."""
    record = json.loads(train_record_path(run).read_text())
    assert record["model"] == "best.json"
    assert record["model_sha256"] == json.loads((run / "best.json").read_text())["sha256"]
    assert record["files"] == {f"{task}-train.csv": file_sha256(scores_path(run, task, "train"))
                               for task in ("sst", "qqp", "sts")}


def test_a_teachers_train_scores_are_tied_to_its_kept_model_and_an_intact_teacher_teaches(teacher_run,
                                                                                           tiny_checkpoint, tmp_path):
    assert_records_its_train_scores(teacher_run)
    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run, teacher)  # a run's folder moved elsewhere is still its own
    assert mc.main(run_flags(tiny_checkpoint, tmp_path / "student", "--distill", str(teacher))) == 0


def another_runs_scores(path, task):
    """The train scores of `path` as another run's model would have written them (other values, the same ids)."""
    ids, scores = read_scores(path, task)
    write_scores(path, ids, scores + 0.25, task)


@pytest.mark.parametrize("swap", ["copied_scores", "retrained_model", "unrecorded_file"])
def test_train_scores_that_are_not_the_teachers_kept_models_are_refused(swap, teacher_run, tiny_checkpoint, tmp_path,
                                                                        capsys):
    """Audit: another run's scores/qqp-train.csv copied into a teacher folder (or the teacher retrained since) was
    distilled from with exit 0. Refused in one line naming the file, exit 2, before training."""
    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run, teacher)
    path = scores_path(teacher, "qqp", "train")
    if swap == "copied_scores":
        another_runs_scores(path, "qqp")
        expected = f"error: {path}: not the train scores {train_record_path(teacher)} records"
    elif swap == "retrained_model":
        best = json.loads((teacher / "best.json").read_text())
        (teacher / "best.json").write_text(json.dumps({**best, "sha256": "0" * 64}))
        expected = f"error: {scores_path(teacher, 'sst', 'train')}: written by another model than"
    else:
        record = json.loads(train_record_path(teacher).read_text())
        del record["files"]["qqp-train.csv"]
        train_record_path(teacher).write_text(json.dumps(record))
        expected = f"error: {path}: not among the train scores"
    capsys.readouterr()
    assert mc.main(run_flags(tiny_checkpoint, tmp_path / "student", "--distill", str(teacher))) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.startswith(expected), error
    assert not (tmp_path / "student" / "run" / "history.json").exists()


def test_a_teacher_written_before_the_record_is_read_unchecked(teacher_run, tiny_checkpoint, tmp_path):
    """Train scores without scores/train.json (committed results/ teachers) still teach, as before."""
    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run, teacher)
    train_record_path(teacher).unlink()
    another_runs_scores(scores_path(teacher, "qqp", "train"), "qqp")  # nothing to tell it from the run's
    assert mc.main(run_flags(tiny_checkpoint, tmp_path / "student", "--distill", str(teacher))) == 0


def test_a_distilled_run_trains_on_the_teachers_scores(teacher_run, tiny_checkpoint, tmp_path, capsys):
    plain, distilled = tmp_path / "plain", tmp_path / "distilled"
    assert mc.main(run_flags(tiny_checkpoint, plain)) == 0
    assert mc.main(run_flags(tiny_checkpoint, distilled, "--distill", str(teacher_run), "--distill_weight", "1",
                             "--distill_temperature", "2")) == 0
    assert "distillation: the train scores of" in capsys.readouterr().out
    losses = [[r.get("train_loss") for r in json.loads((out / "run" / "history.json").read_text())]
              for out in (plain, distilled)]
    assert losses[0][0] is None and losses[0][1:] != losses[1][1:]  # the same run but for the loss


@pytest.mark.parametrize("extra", [["--option", "pretrain", "--adapter", "lora", "--lr", "1e-3"],
                                   ["--schedule", "annealed", "--epochs", "1", "--gradient_surgery", "pcgrad"],
                                   ["--smart", "--lnsr"]], ids=["lora", "annealed-pcgrad", "smart-lnsr"])
def test_distillation_runs_with_adapters_schedules_and_regularisers(extra, teacher_run, tiny_checkpoint, tmp_path):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--distill", str(teacher_run), *extra)) == 0


def test_teachers_that_cannot_teach_this_run_are_one_line_and_exit_2(teacher_run, tiny_checkpoint, tmp_path,
                                                                     capsys):
    no_scores = tmp_path / "empty"
    no_scores.mkdir()
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--distill", str(no_scores))) == 2
    assert "no train scores for --distill" in capsys.readouterr().err
    # The teacher scored 16 training examples per task; a student on 32 trains on examples it never saw.
    argv = run_flags(tiny_checkpoint, tmp_path, "--distill", str(teacher_run), "--max_train_examples", "32")
    assert mc.main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "no teacher score for 16 of the 32 sst training examples" in error[0]
    assert exit_code(run_flags(tiny_checkpoint, tmp_path, "--distill", str(teacher_run), "--distill_weight", "0")) == 2
    for override in ("sst:weight=0", "sst:temperature=-1", "sst:alpha=1", "mlm:weight=1", "sst:weight=high"):
        assert exit_code(run_flags(tiny_checkpoint, tmp_path, "--distill", str(teacher_run),
                                   "--distill_override", override)) == 2, override


def test_a_resume_refuses_a_teacher_whose_scores_changed(teacher_run, tiny_checkpoint, tmp_path, capsys):
    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run / "scores", teacher / "scores")
    train_record_path(teacher).unlink()  # scores alone, not tied to a model: read unchecked, as before the record
    flags = run_flags(tiny_checkpoint, tmp_path, "--distill", str(teacher))
    assert mc.main(flags + ["--stop_after_stages", "1"]) == 0
    path = scores_path(teacher, "qqp", "train")
    ids, scores = read_scores(path, "qqp")
    write_scores(path, ids[::-1], scores[::-1], "qqp")  # the same scores in another order: the same teacher
    assert mc.main(flags + ["--resume", "--stop_after_stages", "2"]) == 0
    write_scores(path, ids, scores + 0.5, "qqp")
    capsys.readouterr()
    assert mc.main(flags + ["--resume"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "differs from the stopped run's (distill/qqp)" in error


def test_distill_override_gives_a_task_its_own_weight(teacher_run, tiny_checkpoint, tmp_path, capsys):
    """The override reaches SST's steps (its loss changes) and the others keep the global setting."""
    plain, overridden = tmp_path / "plain", tmp_path / "overridden"
    assert mc.main(run_flags(tiny_checkpoint, plain, "--distill", str(teacher_run))) == 0
    assert mc.main(run_flags(tiny_checkpoint, overridden, "--distill", str(teacher_run),
                             "--distill_override", "sst:weight=1,temperature=2")) == 0
    out = capsys.readouterr().out
    # the temperature is said of the tasks whose loss has one
    assert (f"sst from {teacher_run} (weight 1.0, temperature 2.0), qqp from {teacher_run} (weight 0.5), "
            f"sts from {teacher_run} (weight 0.5)") in out
    losses = [{r["stage"]: r.get("train_loss") for r in json.loads((out / "run" / "history.json").read_text())}
              for out in (plain, overridden)]
    assert losses[0]["sst"] != losses[1]["sst"]


@pytest.fixture(scope="module")
def other_teacher_run(tiny_checkpoint, tmp_path_factory):
    """A second teacher, trained at another learning rate."""
    out = tmp_path_factory.mktemp("other_teacher")
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert mc.main(run_flags(tiny_checkpoint, out, "--score_train", "--lr", "1e-3")) == 0
    return out / "run"


def test_each_task_may_learn_from_its_own_teacher(teacher_run, other_teacher_run, tiny_checkpoint, tmp_path,
                                                  capsys):
    """qqp:teacher=B over --distill A is the run that names A per task for sst and sts over --distill B; the
    override is heard (the QQP loss differs from A's); a task without a teacher learns from gold alone."""
    a, b = str(teacher_run), str(other_teacher_run)
    runs = {"a_qqp_from_b": ["--distill", a, "--distill_override", "qqp:teacher=" + b],
            "b_sst_sts_from_a": ["--distill", b, "--distill_override", "sst:teacher=" + a,
                                 "--distill_override", "sts:teacher=" + a],
            "a": ["--distill", a],
            "qqp_only": ["--distill_override", "qqp:teacher=" + b],
            "plain": []}
    for name, flags in runs.items():
        assert mc.main(run_flags(tiny_checkpoint, tmp_path / name, *flags)) == 0
    assert capsys.readouterr().out.count(f"distillation: the train scores of qqp from {b} (weight 0.5") == 1
    losses = {name: {r["stage"]: r.get("train_loss")
                     for r in json.loads((tmp_path / name / "run" / "history.json").read_text())} for name in runs}
    assert losses["a_qqp_from_b"] == losses["b_sst_sts_from_a"]
    assert losses["a_qqp_from_b"]["qqp"] != losses["a"]["qqp"]
    assert losses["qqp_only"]["sst"] == losses["plain"]["sst"] and losses["qqp_only"]["qqp"] != losses["plain"]["qqp"]


def test_a_task_teacher_that_cannot_teach_and_an_override_without_a_teacher_exit_2(teacher_run, tiny_checkpoint,
                                                                                   tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--distill", str(teacher_run),
                             "--distill_override", f"qqp:teacher={empty}")) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and str(empty / "scores" / "qqp-train.csv") in error[0]
    assert exit_code(run_flags(tiny_checkpoint, tmp_path, "--distill_override", "sst:weight=1")) == 2
    assert "name one with --distill DIR" in capsys.readouterr().err
    # QQP's and STS's losses soften nothing: a temperature for them would be printed and then ignored
    assert exit_code(run_flags(tiny_checkpoint, tmp_path, "--distill", str(teacher_run),
                               "--distill_override", "sts:weight=0.3,temperature=2")) == 2
    assert "sts's distillation loss has no temperature" in capsys.readouterr().err


def test_an_ensemble_teacher_averages_probabilities_in_the_score_space():
    sst = [np.array([[2.0, 0, 0, 0, 0]]), np.array([[0, 0, 0, 0, 2.0]])]
    combined = teacher_scores("sst", sst)
    expected = (np.exp(sst[0]) / np.exp(sst[0]).sum() + np.exp(sst[1]) / np.exp(sst[1]).sum()) / 2
    assert np.allclose(np.exp(combined), expected)
    qqp = teacher_scores("qqp", [np.array([math.log(3)]), np.array([0.0])])  # probabilities 0.75 and 0.5
    assert qqp[0] == pytest.approx(math.log(0.625 / 0.375))
    assert teacher_scores("sts", [np.array([1.0]), np.array([4.0])], weights=[1, 2])[0] == pytest.approx(3.0)


def test_ensemble_score_train_writes_a_teacher_a_student_learns_from(teacher_run, tiny_checkpoint, tmp_path,
                                                                     capsys):
    other = tmp_path / "other"
    assert mc.main(run_flags(tiny_checkpoint, other, "--score_train", "--lr", "1e-3")) == 0  # another member
    members = [str(teacher_run), str(other / "run")]
    assert ensemble.main([*members, "--output_dir", str(tmp_path / "ens"), "--data_dir", str(DEMO),
                          "--score_train"]) == 0
    ids, scores = read_scores(scores_path(tmp_path / "ens", "qqp", "train"), "qqp")
    member_probabilities = [1 / (1 + np.exp(-read_scores(scores_path(m, "qqp", "train"), "qqp")[1])) for m in members]
    assert len(ids) == 16 and np.allclose(1 / (1 + np.exp(-scores)), np.mean(member_probabilities, axis=0), atol=1e-6)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path / "student", "--distill", str(tmp_path / "ens"))) == 0
    capsys.readouterr()
    # A task no member scored (specialists of another task) is left out of the teacher; one that some members
    # scored and others did not is refused, and so are members written without --score_train.
    first = tmp_path / "first"
    shutil.copytree(teacher_run / "scores", first / "scores")
    shutil.copy(teacher_run / "best.json", first / "best.json")  # the model its scores/train.json records
    members = [str(first), str(other / "run")]

    def teacher_of(name: str) -> int:
        return ensemble.main([*members, "--output_dir", str(tmp_path / name), "--data_dir", str(DEMO),
                              "--score_train"])

    for member in members:
        scores_path(member, "sst", "train").unlink()
    assert teacher_of("no_sst") == 0
    assert sorted(p.name for p in (tmp_path / "no_sst" / "scores").iterdir()) == ["qqp-train.csv", "sts-train.csv",
                                                                                 "train.json"]
    scores_path(other / "run", "qqp", "train").unlink()
    assert teacher_of("half_qqp") == 2 and "qqp-train.csv: no train scores" in capsys.readouterr().err
    for member, task in ((first, "qqp"), (first, "sts"), (other / "run", "sts")):
        scores_path(member, task, "train").unlink()
    assert teacher_of("none") == 2 and "no train scores of any task" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# SQuAD: a QA run's window logits teach another QA run


def qa_flags(checkpoint, out, *extra) -> list[str]:
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--tasks", "qa", "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--lr", "1e-3",
            "--qa_max_length", "48", "--qa_doc_stride", "16", "--qa_max_answer_tokens", "8",
            "--output_dir", str(out / "run"), "--squad_dev_out", str(out / "squad-dev.json"),
            "--squad_test_out", str(out / "squad-test.json"), *extra]


def test_a_qa_student_learns_from_a_qa_teachers_window_logits(tiny_checkpoint, tmp_path, capsys):
    teacher, plain, student = tmp_path / "teacher", tmp_path / "plain", tmp_path / "student"
    assert mc.main(qa_flags(tiny_checkpoint, teacher, "--score_train")) == 0
    spans = read_span_logits(span_logits_path(teacher / "run"))
    assert (spans.max_length, spans.doc_stride) == (48, 16) and len({i.rpartition("#")[0] for i in spans.ids}) == 16
    assert len(spans.ids) > 16 and all(len(row) <= 48 for row in spans.logits)  # several windows per question
    assert mc.main(qa_flags(tiny_checkpoint, plain)) == 0
    assert mc.main(qa_flags(tiny_checkpoint, student, "--distill", str(teacher / "run"), "--distill_weight", "1")) == 0
    assert "distillation: the train scores of" in capsys.readouterr().out
    losses = [[r.get("train_loss") for r in json.loads((out / "run" / "history.json").read_text())]
              for out in (plain, student)]
    assert losses[0][1:] != losses[1][1:]  # the same run but for the loss
    # Windows cut otherwise, or questions the teacher never read: one line, exit 2.
    for extra, message in ((["--qa_doc_stride", "12"], "windows of 48 tokens with stride 16, this run cuts 48 with "
                                                        "stride 12"),
                           (["--max_train_examples", "32"], "no teacher logits for 16 of the 32 qa training questions")):
        assert mc.main(qa_flags(tiny_checkpoint, tmp_path / "refused", "--distill", str(teacher / "run"), *extra)) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and message in error[0]
