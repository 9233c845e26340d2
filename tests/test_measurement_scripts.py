"""scripts/smart_perturbation.py, scripts/smart_precision.py and scripts/sts_objectives.py: the measurements
RESULTS.md quotes run on the demo data, and bad input is one line with exit code 2."""
import pytest
import smart_perturbation
import smart_precision
import sts_objectives
import torch

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


def test_smart_precision_reads_each_precision_against_the_spread_of_other_dropout_masks(capsys, tmp_path):
    save_multitask_model(tiny_model(), tmp_path / "tiny", {})
    assert smart_precision.main(["--data_dir", str(DEMO), "--batches", "1", "--batch_size", "4",
                                 "--checkpoint", str(tmp_path / "tiny")]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| s")
            or line.startswith("| q")]
    variants = [smart_precision.OTHER_MASKS, *smart_precision.precisions(torch.device("cpu"))]
    assert [row[:2] for row in rows] == [[f"| {task}", variant] for task in ("sst", "qqp", "sts") for variant in variants]
    other_masks = [float(row[2]) for row in rows if row[1] == smart_precision.OTHER_MASKS]
    assert all(0 < agreement < 1 for agreement in other_masks)  # another seed: other masks and random start


def test_the_other_masks_variant_is_exact_float32_under_another_seed(tokenizer):
    from minbert.data.batches import TokenizedExamples, load_split
    model = tiny_model().train()
    examples = load_split(str(DEMO), "sts", "train")[:4]
    batch = TokenizedExamples.tokenize(examples, tokenizer, 32).collate(range(4))
    other = smart_precision.one_step(model, "sts", batch, smart_precision.OTHER_MASKS, seed=5)
    moved = smart_precision.one_step(model, "sts", batch, "exact", seed=5 + smart_precision.OTHER_MASKS_SEED_OFFSET)
    same = smart_precision.one_step(model, "sts", batch, "exact", seed=5)
    assert other["r_s"] == moved["r_s"] and torch.equal(other["gradient"], moved["gradient"])
    assert smart_precision.compare(same, same) == (1.0, 0.0, pytest.approx(1.0))
    assert smart_precision.compare(same, other)[0] < 1


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
