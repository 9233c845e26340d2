"""SQuAD 2.0 through the command line, on the demo data and a tiny random BERT: a QA stage in the sequential
schedule, QA inside annealed epochs, QA alone, its adapters, its outputs, --resume, and its bad input."""
import csv
import json
import math
import shutil

import pytest

import multitask_classifier as mc
from conftest import DEMO, exit_code, output_flags
from minbert.tasks.squad import load_squad, squad_metrics

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")
QA_FLAGS = ["--qa_max_length", "48", "--qa_doc_stride", "16", "--qa_max_answer_tokens", "8"]  # tiny: 64 positions


def flags(checkpoint, out, *extra, tasks="sst,qqp,sts,qa") -> list[str]:
    flags = ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
             "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--lr", "1e-3",
             "--tasks", tasks, *QA_FLAGS, "--output_dir", str(out / "run"),
             "--squad_dev_out", str(out / "squad-dev.json"), "--squad_test_out", str(out / "squad-test.json")]
    for flag in output_flags().values():
        flags += [f"--{flag}", str(out / f"{flag}.csv")]
    return flags + list(extra)


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]


def check_squad_outputs(out) -> None:
    """Both predictions files answer every question (a string, "" for no answer), the scores keep every
    question's margin, and the dev file scores what the kept model's record says."""
    for split in ("dev", "test"):
        questions = load_squad(DEMO / f"{split}-v2.0.json", split)
        predicted = json.loads((out / f"squad-{split}.json").read_text())
        assert list(predicted) == [q.id for q in questions]
        assert all(isinstance(answer, str) for answer in predicted.values())
        with open(out / "run" / "scores" / f"qa-{split}.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert [row["id"] for row in rows] == list(predicted)
        assert all(math.isfinite(float(row["no_answer_margin"])) for row in rows)
    kept = json.loads((out / "run" / "best.json").read_text())["metrics"]
    dev = load_squad(DEMO / "dev-v2.0.json", "dev")
    scored = squad_metrics(json.loads((out / "squad-dev.json").read_text()), dev)
    assert (scored["em"], scored["f1"]) == pytest.approx((kept["qa_em"], kept["qa_f1"]), abs=1e-12)


def test_a_qa_stage_in_the_sequential_schedule_with_smart(tiny_checkpoint, tmp_path):
    assert mc.main(flags(tiny_checkpoint, tmp_path, "--smart", "--first_stages", "qqp,qa", "--cycle", "sts,sst,qa:0.5",
                         "--cycles", "1")) == 0
    history = records(tmp_path)
    assert [r["stage"] for r in history] == ["pretrained", "qqp", "qa", "sts", "sst", "qa@0.5"]
    assert all({"overall", "qa_f1", "qa_threshold", "qa_f1_at_0"} <= r.keys() for r in history)
    check_squad_outputs(tmp_path)
    assert len(list(tmp_path.glob("*.csv"))) == 6
    assert "SQuAD F1" in (tmp_path / "run" / "forgetting.md").read_text()


def test_qa_in_annealed_epochs_with_the_other_three(tiny_checkpoint, tmp_path):
    assert mc.main(flags(tiny_checkpoint, tmp_path, "--schedule", "annealed", "--epochs", "2")) == 0
    assert [r["stage"] for r in records(tmp_path)] == ["pretrained", "multitask-1", "multitask-2"]
    check_squad_outputs(tmp_path)


def test_qa_alone_writes_only_its_own_outputs(tiny_checkpoint, tmp_path):
    assert mc.main(flags(tiny_checkpoint, tmp_path, tasks="qa")) == 0
    assert [r["stage"] for r in records(tmp_path)] == ["pretrained", "qa"]  # --tasks qa: one QA epoch by default
    assert not any("sst_acc" in r for r in records(tmp_path))
    check_squad_outputs(tmp_path)
    assert not list(tmp_path.glob("*.csv")) and not (tmp_path / "run" / "forgetting.md").exists()
    assert (tmp_path / "run" / "history.json").is_file()


def test_a_qa_adapter_over_the_frozen_encoder_leaves_the_other_tasks_as_they_were(tiny_checkpoint, tmp_path):
    assert mc.main(flags(tiny_checkpoint, tmp_path, "--option", "pretrain", "--adapter", "lora",
                         "--first_stages", "qa", "--cycles", "0")) == 0
    pretrained, trained = records(tmp_path)
    for key in ("sst_acc", "qqp_acc", "sts_pearson"):
        assert trained[key] == pretrained[key], key


def test_a_run_with_a_qa_stage_resumes_bitwise(tiny_checkpoint, tmp_path):
    stages = ("--first_stages", "qa,sts", "--cycles", "0", "--smart")
    assert mc.main(flags(tiny_checkpoint, tmp_path / "straight", *stages)) == 0
    assert mc.main(flags(tiny_checkpoint, tmp_path / "stopped", *stages, "--stop_after_stages", "1")) == 0
    assert mc.main(flags(tiny_checkpoint, tmp_path / "stopped", *stages, "--resume")) == 0
    def without_times(out):
        return [{k: v for k, v in r.items() if k not in ("seconds", "eval_seconds")} for r in records(out)]
    assert without_times(tmp_path / "stopped") == without_times(tmp_path / "straight")
    for split in ("dev", "test"):
        assert (tmp_path / "stopped" / f"squad-{split}.json").read_text() == \
            (tmp_path / "straight" / f"squad-{split}.json").read_text()


def test_the_official_download_without_a_test_file_predicts_dev_only(tiny_checkpoint, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(DEMO, data)
    (data / "test-v2.0.json").unlink()
    argv = flags(tiny_checkpoint, tmp_path, tasks="qa")
    argv[argv.index("--data_dir") + 1] = str(data)
    assert mc.main(argv) == 0
    assert "SQuAD's test set is not predicted" in capsys.readouterr().out
    assert (tmp_path / "squad-dev.json").is_file() and not (tmp_path / "squad-test.json").exists()


@pytest.mark.parametrize("extra, problem", [
    (["--tasks", "sst,qqp,sts", "--first_stages", "qa"], "not among the run's tasks"),
    (["--tasks", "sst,mnli"], "--tasks: unknown task 'mnli'"),
    (["--tasks", "sst,qqp,sts", "--smart", "--smart_tasks", "qa"], "--smart_tasks: unknown task 'qa'"),
    (["--tasks", "qa", "--qa_doc_stride", "384"], "--qa_doc_stride must be below --qa_max_length"),
    (["--tasks", "qa", "--mlm_epochs", "1", "--option", "finetune"], "none of them is among --tasks"),
])
def test_bad_qa_flags_exit_2_before_loading_the_model(tmp_path, capsys, model_must_not_load, extra, problem):
    assert exit_code(["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run"), *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], lines


def test_a_bad_squad_file_exits_2_naming_the_file_and_question(tmp_path, capsys, model_must_not_load):
    data = tmp_path / "data"
    shutil.copytree(DEMO, data)
    document = json.loads((data / "dev-v2.0.json").read_text())
    question = next(q for a in document["data"] for p in a["paragraphs"] for q in p["qas"] if not q["is_impossible"])
    question["answers"][0]["answer_start"] += 1
    (data / "dev-v2.0.json").write_text(json.dumps(document))
    assert mc.main(["--data_dir", str(data), "--tasks", "qa", "--output_dir", str(tmp_path / "run"), "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(data / "dev-v2.0.json") in lines[0] and question["id"] in lines[0], lines


def test_demo_with_qa_takes_the_qa_stages_and_keeps_the_demo_settings():
    args = mc.parse_args(["--demo", "--tasks", "qa"])
    assert (args.first_stages, args.cycle, args.qa_max_length, args.pretrained) == ("qa", "", 128, "minilm-l6")
    assert mc.parse_args(["--demo"]).first_stages == "qqp"
