"""predict.py: a run's kept model predicts any text as the run would, in the course's CSV or as JSON lines; bad input
is one line with exit code 2 before the model loads."""
import io
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from calibrate import main as calibrate_main

import multitask_classifier
import predict
from conftest import DEMO, ROOT, prediction_flags
from minbert.files import DataError
from minbert.prediction.new_inputs import input_format, output_format, prediction_records, read_examples
from minbert.tasks import MULTITASK, TASKS, course_file_name
from minbert.tasks.calibration import read_calibration

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")


@pytest.fixture(scope="module")
def run(tiny_checkpoint, tmp_path_factory):
    """A tiny run that trains every head of the multitask model and writes its six CSVs in run/predictions."""
    folder = tmp_path_factory.mktemp("predict") / "run"
    assert multitask_classifier.main([
        "--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
        "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--eval_batch_size", "7",
        "--lr", "1e-3", "--first_stages", "qqp,sts,sst", "--cycles", "0", "--output_dir", str(folder),
        *prediction_flags(folder / "predictions")]) == 0
    return folder


@pytest.fixture
def checkpoint_must_not_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was validated")
    monkeypatch.setattr(predict, "load_multitask_checkpoint", refuse)


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("task", MULTITASK)
@pytest.mark.parametrize("split", ["dev", "test"])
def test_the_kept_model_writes_the_runs_own_csvs_byte_for_byte(run, tmp_path, task, split):
    out = tmp_path / "out.csv"
    assert predict.main([str(run), "--task", task, "--input", str(DEMO / course_file_name(task, split)),
                         "--output", str(out), "--quiet"]) == 0
    written = run / "predictions" / f"{TASKS[task].flag_prefix}-{split}-out.csv"
    assert out.read_bytes() == written.read_bytes()


def test_lines_on_standard_input_give_json_lines_with_label_score_and_probabilities(run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("How do I learn Python?\tWhat is the best way to learn it?\n\n"
                                                  "Is it raining?\tIs the sun out?\n"))
    assert predict.main([str(run), "--task", "para", "--quiet"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in records] == ["1", "3"]  # line numbers; the blank line is skipped
    for record in records:
        assert record["label"] == int(record["score"] > 0)  # QQP decides by the logit's sign
        assert len(record["probabilities"]) == 2 and sum(record["probabilities"]) == pytest.approx(1, abs=1e-5)
        assert record["probabilities"][1] == pytest.approx(1 / (1 + np.exp(-record["score"])), abs=1e-5)


def test_json_lines_keep_their_ids_and_match_the_course_files_predictions(run, tmp_path):
    examples = read_examples(TASKS["sts"], str(DEMO / "sts-dev.csv"), "course")
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps({"id": e.id, "sentence1": e.sentence1, "sentence2": e.sentence2}) + "\n"
                              for e in examples))
    out = tmp_path / "scores.jsonl"
    assert predict.main([str(run), "--task", "sts", "--input", str(source), "--output", str(out), "--quiet"]) == 0
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    course = dict(line.split(",") for line in (run / "predictions" / "sts-dev-out.csv").read_text().splitlines()[1:])
    # The same examples, so the same batches: the labels are the CSV's cells.
    assert {i: TASKS["sts"].format_prediction(r["label"]) for i, r in records.items()} == course
    assert all(0 <= r["label"] <= 5 and "probabilities" not in r for r in records.values())


def test_formats_follow_the_names_unless_asked():
    assert [input_format(s, None) for s in ("-", "a.txt", "a.jsonl", "sts-dev.csv")] == ["lines", "lines", "jsonl",
                                                                                         "course"]
    assert input_format("a.csv", "lines") == "lines"
    assert [output_format(d, None) for d in ("-", "out.csv", "out.jsonl", "out")] == ["jsonl", "csv", "jsonl", "jsonl"]


def test_sst_records_decide_the_class_of_the_highest_probability():
    scores = np.array([[0.1, 2.0, -1.0, 0.0, 0.3], [3.0, 0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    records = prediction_records(TASKS["sst"], ["a", "b"], scores)
    assert [r["label"] for r in records] == [1, 0]
    assert all(int(np.argmax(r["probabilities"])) == r["label"] for r in records)


@pytest.mark.parametrize("text, fmt, problem", [
    ("a sentence\n", "lines", "<stdin>:1: qqp reads one example a line, two sentences separated by a tab; found 1"),
    ("a\tb\tc\n", "lines", "<stdin>:1: qqp reads one example a line, two sentences separated by a tab; found 3"),
    ("\n\n", "lines", "<stdin>: no examples: every line is blank"),
    ('{"sentence1": "a"}\n', "jsonl", "<stdin>:1: 'sentence2' must be a string (missing)"),
    ('{"sentence1": "a", "sentence2": 3}\n', "jsonl", "<stdin>:1: 'sentence2' must be a string (found int)"),
    ('["a", "b"]\n', "jsonl", "<stdin>:1: a line must be a JSON object, found a list"),
    ("{oops\n", "jsonl", "<stdin>:1: not a JSON value"),
    ('{"id": "x", "sentence1": "a", "sentence2": "b"}\n{"id": "x", "sentence1": "c", "sentence2": "d"}\n', "jsonl",
     "<stdin>:2: duplicate id 'x' (first on line 1)"),
])
def test_text_the_task_cannot_read_is_one_line_naming_the_line(text, fmt, problem):
    with pytest.raises(DataError) as raised:
        read_examples(TASKS["qqp"], "-", fmt, io.StringIO(text))
    assert str(raised.value).startswith(problem)


@pytest.mark.parametrize("separator", ["\u2028", "\x85", "\x0c", "\x1c"])
def test_a_line_ends_at_a_newline_alone_in_every_format(tmp_path, separator):
    """str.splitlines() also splits at these, which made one example two and shifted every later id."""
    sentence = f"A gripping{separator}funny film."
    plain = f"{sentence}\r\nDull.\r\n"  # a Windows file: one "\r" dropped
    jsonl = json.dumps({"sentence": sentence}, ensure_ascii=False) + "\n" + json.dumps({"sentence": "Dull."}) + "\n"
    course = tmp_path / "ids-sst-dev.csv"
    course.write_text(f"\tid\tsentence\tsentiment\n0\t1\t{sentence}\t3\n1\t2\tDull.\t1\n", newline="")
    (tmp_path / "plain.txt").write_text(plain, newline="")
    read = [read_examples(TASKS["sst"], "-", "lines", io.StringIO(plain, newline="")),
            read_examples(TASKS["sst"], str(tmp_path / "plain.txt"), "lines"),
            read_examples(TASKS["sst"], "-", "jsonl", io.StringIO(jsonl, newline="")),
            read_examples(TASKS["sst"], str(course), "course")]
    for examples in read:
        assert [(e.id, e.sentence) for e in examples] == [("1", sentence), ("2", "Dull.")]


@pytest.mark.parametrize("example_id", ["", "  "])
def test_an_empty_json_id_is_refused_as_the_course_loader_refuses_one(example_id):
    text = json.dumps({"id": example_id, "sentence": "A film."}) + "\n"
    with pytest.raises(DataError) as raised:
        read_examples(TASKS["sst"], "-", "jsonl", io.StringIO(text))
    assert str(raised.value) == "<stdin>:1: empty id"


def test_a_course_row_without_a_label_is_predicted_not_dropped(tmp_path):
    course = tmp_path / "quora-dev.csv"
    course.write_text("\tid\tsentence1\tsentence2\tis_duplicate\n0\ta\tOne?\tTwo?\t1.0\n1\tb\tThree?\tFour?\t\n")
    assert [e.id for e in read_examples(TASKS["qqp"], str(course), "course")] == ["a", "b"]


@pytest.mark.parametrize("argv, problem", [
    (["{tmp}", "--task", "sst"], "{tmp}: no kept model (best.json and best.safetensors)"),
    (["{tmp}/nope", "--task", "sst"], "{tmp}/nope: neither a run's folder nor a checkpoint"),
    (["{run}", "--task", "sst", "--input", "{tmp}/missing.csv"], "{tmp}/missing.csv: file not found"),
    (["{run}", "--task", "sts", "--input", str(DEMO / "ids-sst-dev.csv")], "missing required column 'sentence1'"),
    (["{run}", "--task", "sst", "--input", str(DEMO / "ids-sst-dev.csv"), "--output", "{tmp}"],
     "--output {tmp}: a folder; name the file to write"),
])
def test_a_bad_run_input_or_output_is_one_line_and_exit_2_before_the_model_loads(run, tmp_path, capsys, argv,
                                                                                   problem, checkpoint_must_not_load):
    values = {"tmp": tmp_path, "run": run}
    assert predict.main([a.format(**values) for a in argv]) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: ") and problem.format(**values) in line


@pytest.mark.parametrize("where", ["its input", "its input spelled otherwise", "another run's folder"])
def test_the_output_never_replaces_the_input_or_another_runs_file(run, tmp_path, capsys, checkpoint_must_not_load,
                                                                   monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "in.csv"
    shutil.copy(DEMO / "ids-sst-dev.csv", source)
    other = tmp_path / "other"
    other.mkdir()
    (other / "best.json").write_text("{}")
    out = {"its input": source, "its input spelled otherwise": "other/../in.csv",
           "another run's folder": other / "sst-dev-out.csv"}[where]
    assert predict.main([str(run), "--task", "sst", "--input", str(source), "--output", str(out)]) == 2
    assert one_error_line(capsys).startswith(f"error: --output {out}: ")
    assert source.read_bytes() == (DEMO / "ids-sst-dev.csv").read_bytes() and not (other / "sst-dev-out.csv").exists()


@pytest.mark.parametrize("flags, problem", [
    (["--task", "squad"], "--task: unknown task 'squad'; use one of sst, qqp, sts"),
    (["--task", "sst", "--batch_size", "0"], "--batch_size must be >= 1, got 0"),
    (["--task", "sts", "--calibrated"], "--calibrated: sts has no temperature (the calibrated tasks: sst, qqp)"),
    (["--task", "sst", "--threshold"], "--threshold: sst has no decision threshold (the tasks with one: qqp)"),
])
def test_bad_flags_are_refused_by_the_parser(run, capsys, flags, problem):
    with pytest.raises(SystemExit) as exit_info:
        predict.main([str(run), *flags])
    assert exit_info.value.code == 2 and problem in capsys.readouterr().err


def test_calibrated_probabilities_divide_the_logits_by_the_runs_temperature(run, tmp_path):
    fitted = read_calibration(run)
    for task in ("sst", "qqp"):
        plain, calibrated = tmp_path / f"{task}.jsonl", tmp_path / f"{task}-calibrated.jsonl"
        for flags, out in (([], plain), (["--calibrated"], calibrated)):
            assert predict.main([str(run), "--task", task, "--input", str(DEMO / course_file_name(task, "dev")),
                                 "--output", str(out), "--quiet", *flags]) == 0
        before, after = ([json.loads(line) for line in path.read_text().splitlines()] for path in (plain, calibrated))
        assert [(r["label"], r["score"]) for r in before] == [(r["label"], r["score"]) for r in after]
        expected = TASKS[task].probabilities(np.array([r["score"] for r in after]) / fitted[task]["temperature"])
        assert np.array([r["probabilities"] for r in after]) == pytest.approx(expected, abs=1e-6)


def test_the_threshold_decides_the_csv_as_the_script_does_from_the_runs_scores(run, tmp_path):
    out = tmp_path / "para.csv"
    assert predict.main([str(run), "--task", "para", "--input", str(DEMO / course_file_name("qqp", "test")),
                         "--output", str(out), "--quiet", "--threshold"]) == 0
    assert calibrate_main([str(run), "--data_dir", str(DEMO), "--threshold_out", str(tmp_path / "script")]) == 0
    assert out.read_bytes() == (tmp_path / "script" / "para-test-out.csv").read_bytes()


def test_dev_fitted_flags_need_the_kept_models_calibration_before_the_model_loads(run, tmp_path, capsys,
                                                                                checkpoint_must_not_load):
    (tmp_path / "stage_1.json").write_text("{}")
    (tmp_path / "stage_1.safetensors").write_bytes(b"")
    sentences = ["--input", str(DEMO / "ids-sst-dev.csv")]
    assert predict.main([str(tmp_path / "stage_1"), "--task", "sst", "--calibrated", *sentences]) == 2
    assert f"--calibrated: {tmp_path / 'calibration.json'} was fitted on the kept model (best), not stage_1" in \
        one_error_line(capsys)
    for name in ("best.json", "best.safetensors"):
        (tmp_path / name).write_bytes((run / name).read_bytes())
    assert predict.main([str(tmp_path), "--task", "qqp", "--calibrated", "--threshold", "--input",
                         str(DEMO / "quora-dev.csv")]) == 2
    assert f"{tmp_path / 'calibration.json'}: no such file" in one_error_line(capsys)


def test_the_command_line_reads_standard_input(run):
    result = subprocess.run([sys.executable, str(ROOT / "predict.py"), str(run), "--task", "sst", "--quiet"],
                            input="A gripping, funny film.\n", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (record,) = map(json.loads, result.stdout.splitlines())
    assert record["id"] == "1" and record["label"] in range(5) and len(record["score"]) == 5


def test_a_task_the_model_has_no_head_for_is_one_line(tmp_path, capsys):
    """model.objectives holds every trainable task's objective, heads or not: the check reads the model's tasks."""
    from conftest import tiny_model
    from minbert.model.multitask_bert import save_multitask_model
    save_multitask_model(tiny_model(tasks=("sst",)), tmp_path / "best", {"args": {"pretrained": "minilm-l6"}})
    assert predict.main([str(tmp_path), "--task", "qqp", "--input", str(DEMO / "quora-dev.csv"), "--quiet"]) == 2
    assert one_error_line(capsys) == f"error: {tmp_path / 'best'}: the model has no qqp head (it has sst)"
