"""predict.py: a run's kept model predicts any text as the run would, in the course's CSV or as JSON lines; bad input
is one line with exit code 2 before the model loads."""
import io
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from calibrate import main as calibrate_main

import multitask_classifier
import predict
from conftest import DEMO, ROOT, prediction_flags
from minbert.files import DataError
from minbert import load_run
from minbert.prediction.new_inputs import input_format, output_format, predictions_of, read_examples, score_name
from minbert.run import trained_run
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
    monkeypatch.setattr(trained_run, "load_multitask_checkpoint", refuse)


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


def test_lines_on_standard_input_give_json_lines_with_label_name_logit_and_probabilities(run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("How do I learn Python?\tWhat is the best way to learn it?\n\n"
                                                  "Is it raining?\tIs the sun out?\n"))
    assert predict.main([str(run), "--task", "para", "--quiet"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in records] == ["1", "3"]  # line numbers; the blank line is skipped
    for record in records:
        assert list(record) == ["id", "label", "class", "probabilities", "logit"]
        assert record["class"] == int(record["logit"] > 0)  # QQP decides by the logit's sign
        assert record["label"] == ("not paraphrase", "paraphrase")[record["class"]]
        probabilities = record["probabilities"]
        assert list(probabilities) == ["not paraphrase", "paraphrase"]
        assert sum(probabilities.values()) == pytest.approx(1, abs=1e-5)
        assert probabilities["paraphrase"] == pytest.approx(1 / (1 + np.exp(-record["logit"])), abs=1e-5)


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
    assert {i: TASKS["sts"].outputs.format_prediction(r["label"]) for i, r in records.items()} == course
    assert all(list(r) == ["id", "label", "score"] and 0 <= r["label"] <= 5 for r in records.values())


def test_formats_follow_the_names_unless_asked():
    assert [input_format(s, None) for s in ("-", "a.txt", "a.jsonl", "sts-dev.csv")] == ["lines", "lines", "jsonl",
                                                                                         "course"]
    assert input_format("a.csv", "lines") == "lines"
    assert [output_format(d, None) for d in ("-", "out.csv", "out.jsonl", "out")] == ["jsonl", "csv", "jsonl", "jsonl"]


def test_sst_records_decide_the_class_of_the_highest_probability():
    scores = np.array([[0.1, 2.0, -1.0, 0.0, 0.3], [3.0, 0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    records = predictions_of(TASKS["sst"], ["a", "b"], scores).records()
    assert [(r["class"], r["label"]) for r in records] == [(1, "somewhat negative"), (0, "negative")]
    assert all(max(r["probabilities"], key=r["probabilities"].get) == r["label"] for r in records)
    assert records[0]["logits"] == pytest.approx(scores[0].tolist())


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


@pytest.mark.parametrize("where", ["its input", "its input spelled otherwise", "another run's folder",
                                   "the kept model's record", "the run's leaderboard file"])
def test_the_output_never_replaces_the_input_or_another_runs_file(run, tmp_path, capsys, checkpoint_must_not_load,
                                                                   monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "in.csv"
    shutil.copy(DEMO / "ids-sst-dev.csv", source)
    other = tmp_path / "other"
    other.mkdir()
    (other / "best.json").write_text("{}")
    out = {"its input": source, "its input spelled otherwise": "other/../in.csv",
           "another run's folder": other / "sst-dev-out.csv", "the kept model's record": run / "best.json",
           "the run's leaderboard file": run / "predictions" / "sst-dev-out.csv"}[where]
    run_files = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    assert predict.main([str(run), "--task", "sst", "--input", str(source), "--output", str(out)]) == 2
    assert one_error_line(capsys).startswith(f"error: --output {out}: ")
    assert source.read_bytes() == (DEMO / "ids-sst-dev.csv").read_bytes() and not (other / "sst-dev-out.csv").exists()
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == run_files


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
        score = score_name(TASKS[task])
        assert [(r["label"], r[score]) for r in before] == [(r["label"], r[score]) for r in after]
        expected = TASKS[task].outputs.probabilities(np.array([r[score] for r in after]) / fitted[task]["temperature"])
        assert np.array([list(r["probabilities"].values()) for r in after]) == pytest.approx(expected, abs=1e-6)


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
    assert record["id"] == "1" and record["label"] == TASKS["sst"].label_names[record["class"]]
    assert len(record["logits"]) == 5


def test_a_task_the_model_has_no_head_for_is_one_line(tmp_path, capsys):
    """model.objectives holds every trainable task's objective, heads or not: the check reads the model's tasks."""
    from conftest import tiny_model
    from minbert.model.multitask_bert import save_multitask_model
    save_multitask_model(tiny_model(tasks=("sst",)), tmp_path / "best", {"args": {"pretrained": "minilm-l6"}})
    assert predict.main([str(tmp_path), "--task", "qqp", "--input", str(DEMO / "quora-dev.csv"), "--quiet"]) == 2
    assert one_error_line(capsys) == f"error: {tmp_path / 'best'}: the model has no qqp head (it has sst)"


@pytest.fixture(scope="module")
def loaded(run):
    return load_run(run, device="cpu")


def dev_texts(task: str) -> list:
    examples = read_examples(TASKS[task], str(DEMO / course_file_name(task, "dev")), "course")
    return [e.sentence if TASKS[task].text_columns == ("sentence",) else (e.sentence1, e.sentence2) for e in examples]


@pytest.mark.parametrize("task", MULTITASK)
def test_the_python_api_predicts_what_predict_py_writes_and_the_runs_dev_csv(run, loaded, tmp_path, task):
    out = tmp_path / "out.jsonl"
    assert predict.main([str(run), "--task", task, "--input", str(DEMO / course_file_name(task, "dev")), "--output",
                         str(out), "--quiet"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    predictions = loaded.predict(dev_texts(task), task=task)
    # The same texts, so the same batches: the ids are the API's line numbers, the rest is predict.py's.
    assert [{**r, "id": None} for r in predictions.records()] == [{**r, "id": None} for r in written]
    assert predictions.label_names == [r["label"] for r in written]
    csv_cells = [line.split(",")[1] for line in
                 (run / "predictions" / f"{TASKS[task].flag_prefix}-dev-out.csv").read_text().splitlines()[1:]]
    assert [TASKS[task].outputs.format_prediction(label) for label in predictions.labels] == csv_cells


def test_the_python_api_applies_the_runs_temperature_and_threshold_as_predict_py_does(run, loaded, tmp_path):
    out = tmp_path / "out.jsonl"
    assert predict.main([str(run), "--task", "qqp", "--input", str(DEMO / "quora-dev.csv"), "--output", str(out),
                         "--quiet", "--calibrated", "--threshold"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    predictions = loaded.predict(dev_texts("qqp"), task="para", calibrated=True, threshold=True)
    assert [{**r, "id": None} for r in predictions.records()] == [{**r, "id": None} for r in written]
    threshold = read_calibration(run)["qqp"]["threshold"]["logit"]
    assert predictions.labels.tolist() == (predictions.scores > threshold).astype(int).tolist()
    plain = loaded.predict(dev_texts("qqp"), task="qqp")
    assert not np.allclose(plain.probabilities, predictions.probabilities)  # the temperature is not 1


def test_a_calibration_copied_from_another_run_is_refused_by_the_api_and_predict_py(run, tmp_path, capsys):
    """Audit: load_run(...).predict(..., calibrated=True) applied the temperature of a calibration.json copied from
    another run. The accuracies it records are those of the dev scores it was fitted on: they must be the ones the
    run's best.json records, else one line naming the file, before any model loads."""
    for name in ("best.json", "best.safetensors"):
        shutil.copy(run / name, tmp_path / name)
    calibration = json.loads((run / "calibration.json").read_text())
    calibration["tasks"]["sst"]["accuracy"] += 0.125  # another run's, fitted on its own dev scores
    (tmp_path / "calibration.json").write_text(json.dumps(calibration))
    copied = load_run(tmp_path, device="cpu")
    assert copied.predict(["A gripping film."], task="sst").labels.shape == (1,)  # no dev-fitted choice: not read
    for task, asked in (("sst", {"calibrated": True}), ("qqp", {"threshold": True})):
        with pytest.raises(trained_run.ScoresFileError) as refused:
            copied.predict([("a", "b")] if task == "qqp" else ["A gripping film."], task=task, **asked)
        assert str(refused.value).startswith(f"{tmp_path / 'calibration.json'}: fitted on dev scores of sst accuracy ")
        assert str(refused.value).endswith(f"that {tmp_path / 'best.json'} records: not this run's calibration")
    assert predict.main([str(tmp_path), "--task", "sst", "--calibrated", "--input", str(DEMO / "ids-sst-dev.csv"),
                         "--quiet"]) == 2
    assert one_error_line(capsys).endswith("records: not this run's calibration")


def test_encode_gives_each_sentence_the_runs_pooled_embedding(loaded, tokenizer):
    sentences = ["A gripping, funny film.", "Dull.", "The plot wanders but the actors hold it together."]
    embeddings = loaded.encode(sentences)
    assert embeddings.shape == (3, 32) and embeddings.dtype == np.float32
    for sentence, embedding in zip(sentences, embeddings):  # each alone, unpadded: the pooling of its own tokens
        encoded = tokenizer([sentence], return_tensors="pt", padding=True)
        with torch.inference_mode():
            alone = loaded.model.encode_sentences(encoded["input_ids"], encoded["attention_mask"])[0].numpy()
        assert embedding == pytest.approx(alone, abs=1e-3)  # padded in a batch: float rounding only
    assert loaded.encode(sentences[1]) == pytest.approx(embeddings[1])  # one string: one vector
    unit = loaded.encode(sentences, normalize_embeddings=True)
    assert np.linalg.norm(unit, axis=1) == pytest.approx(np.ones(3), abs=1e-6)


@pytest.mark.parametrize("call, problem", [
    (lambda run: run.predict(["a"], task="squad"), "unknown task 'squad'"),
    (lambda run: run.predict("A film.", task="sst"), "sst: give a list of texts, not one string"),
    (lambda run: run.predict(["One?"], task="qqp"), "qqp: text 1 must be a pair of strings, got 'One?'"),
    (lambda run: run.predict([("a", "b")], task="sts", calibrated=True), "calibrated=True: sts has no temperature"),
])
def test_the_python_api_refuses_what_it_cannot_predict_in_one_line(loaded, call, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        call(loaded)
