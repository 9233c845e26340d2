"""distillation.py: the losses on hand-made tensors, the teacher's scores by id, and --score_train / --distill
through the command line on the demo data with a tiny BERT."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ensemble
import multitask_classifier as mc
from conftest import DEMO, exit_code, prediction_flags, skip_figures
from distillation import Distillation, TeacherScores, distillation_loss, load_teacher
from ensemble_scores import teacher_scores
from scores import ScoresFileError, read_scores, scores_path, write_scores

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")


def random_scores(task: str, n: int = 6, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if task == "sst":
        return torch.randn(n, 5, generator=generator) * 2
    if task == "qqp":
        return torch.randn(n, generator=generator) * 3
    return torch.rand(n, generator=generator) * 5


# ---------------------------------------------------------------------------------------------------
# The losses


@pytest.mark.parametrize("task", ["sst", "qqp", "sts"])
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
    with pytest.raises(ValueError, match="no distillation loss"):
        distillation_loss("qa", student, teacher)


def test_mix_weighs_gold_and_teacher_and_leaves_other_tasks_alone():
    teacher = TeacherScores({"a": 1, "b": 0}, np.array([[3.0], [1.0]]))
    distillation = Distillation({"sts": teacher}, weight=0.25)
    gold, student = torch.tensor(0.4), torch.tensor([3.0, 3.0])
    expected = 0.75 * 0.4 + 0.25 * F.mse_loss(student, torch.tensor([1.0, 3.0])).item() / 25
    assert distillation.mix("sts", gold, student, ["b", "a"]).item() == pytest.approx(expected)
    assert distillation.mix("sst", gold, student, ["b", "a"]) is gold
    for weight, temperature in ((0.0, 1.0), (1.5, 1.0), (0.5, 0.0), (math.nan, 1.0)):
        with pytest.raises(ValueError):
            Distillation({}, weight, temperature)


# ---------------------------------------------------------------------------------------------------
# The teacher's scores


def test_the_teacher_is_read_by_id_whatever_its_row_order(tmp_path):
    write_scores(scores_path(tmp_path, "sst", "train"), ["x", "y", "z"], np.arange(15.0).reshape(3, 5), "sst")
    teacher = load_teacher(tmp_path, {"sst": ["z", "x"]})
    assert teacher["sst"].of(["z", "x"]).tolist() == [[10, 11, 12, 13, 14], [0, 1, 2, 3, 4]]


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
    # Members written without --score_train cannot teach.
    for path in (other / "run" / "scores").glob("*-train.csv"):
        path.unlink()
    assert ensemble.main([*members, "--output_dir", str(tmp_path / "ens2"), "--data_dir", str(DEMO),
                          "--score_train"]) == 2
    assert "no train scores; rerun that member with --score_train" in capsys.readouterr().err
