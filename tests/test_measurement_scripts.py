"""scripts/smart_perturbation.py and scripts/sts_objectives.py: the measurements RESULTS.md quotes run on the demo
data, and bad input is one line with exit code 2."""
import pytest
import smart_perturbation
import sts_objectives

from conftest import DEMO, tiny_model
from minbert.model.multitask_bert import save_multitask_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_smart_perturbation_prints_a_row_per_task_epsilon_and_precision(capsys, tmp_path):
    save_multitask_model(tiny_model(), tmp_path / "tiny", {})  # a trained model's checkpoint, at no cost
    assert smart_perturbation.main(["--data_dir", str(DEMO), "--batches", "1", "--batch_size", "4",
                                    "--epsilons", "1e-3", "--checkpoint", str(tmp_path / "tiny")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| s")]
    assert [row.split(" | ")[:3] for row in rows] == [
        ["| sst (categorical)", "0.001", "fp32"], ["| sst (categorical)", "0.001", "bf16"],
        ["| sts (squared)", "0.001", "fp32"], ["| sts (squared)", "0.001", "bf16"]]
    for row in rows:  # both divergences are finite and positive: the perturbation and dropout each move the outputs
        adversarial, dropout = (float(cell) for cell in row.split(" | ")[3:5])
        assert 0 < adversarial < float("inf") and 0 < dropout < float("inf")


@pytest.mark.parametrize("script, flags, problem", [
    (smart_perturbation, ["--checkpoint", "{tmp}/nope"], "nope: no checkpoint here"),
    (smart_perturbation, ["--data_dir", "{tmp}"], "ids-sst-dev.csv: file not found"),
    (sts_objectives, ["--data_dir", "{tmp}"], "sts-train.csv: file not found"),
])
def test_bad_input_is_one_line(script, flags, problem, tmp_path, capsys):
    assert script.main([flag.format(tmp=tmp_path) for flag in flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and problem in err


def test_unknown_sts_objective_is_refused_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        sts_objectives.main(["--data_dir", str(DEMO), "--objectives", "cosine,foo"])
    assert exit_info.value.code == 2 and "--objectives: unknown foo" in capsys.readouterr().err
