"""Bad input, kills and corrupted files: one clear line and exit code 2, never a traceback or a lost row."""
import json
import os
import runpy
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import minbert.model.checkpoint as checkpoint
import multitask_classifier as mc
import prepare_submit
from base_bert import CheckpointError
from conftest import DEMO, ROOT, exit_code
from evaluation import write_predictions
from minbert.data.batches import DataError, load_examples, standard_paths
from minbert.model.checkpoint import atomic_save, read_checkpoint
from minbert.model.multitask_bert import load_multitask_model
from tokenizer import BertTokenizer

pytestmark = pytest.mark.usefixtures("no_plots")


def quick_flags(checkpoint_dir, out, *extra) -> list[str]:
    flags = ["--data_dir", str(DEMO), "--pretrained", str(checkpoint_dir), "--option", "finetune", "--quiet",
             "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--first_stages", "sst",
             "--cycle", "sts", "--cycles", "1", "--output_dir", str(out / "run")]
    for task in ("sst", "para", "sts"):
        for split in ("dev", "test"):
            flags += [f"--{task}_{split}_out", str(out / f"{task}-{split}.csv")]
    return flags + list(extra)


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# -- data files --------------------------------------------------------------------------------------


def test_a_stray_quote_that_would_swallow_rows_is_an_error_at_its_line(tmp_path):
    lines = (DEMO / "ids-sst-dev.csv").read_text().splitlines(keepends=True)
    fields = lines[3].split("\t")
    fields[2] = '"' + fields[2]  # the next quote is rows later: the csv module would merge those rows
    lines[3] = "\t".join(fields)
    (tmp_path / "ids-sst-dev.csv").write_text("".join(lines))
    with pytest.raises(DataError, match=r"ids-sst-dev.csv:4: a double quote opens a field that runs on"):
        load_examples(tmp_path / "ids-sst-dev.csv", "sst", "dev")


def test_quoted_fields_of_the_course_format_still_read_as_one_row_each(tmp_path):
    path = tmp_path / "sts-dev.csv"
    path.write_text('\tid\tsentence1\tsentence2\tsimilarity\n'
                    '0\ta1\t"He said ""hi"" twice."\tHello.\t3.0\n1\ta2\tPlain.\t"Quoted, fine"\t1.0\n')
    examples = load_examples(path, "sts", "dev")
    assert [e.sentence1 for e in examples] == ['He said "hi" twice.', "Plain."]


# -- checkpoints -------------------------------------------------------------------------------------


def test_a_kill_between_the_two_moves_leaves_the_new_checkpoint_readable(tmp_path, monkeypatch):
    atomic_save(tmp_path / "last", {"w": torch.zeros(2)}, {"n": 1})
    real_replace, calls = os.replace, []

    def killed_at_the_second_move(source, target):
        if not str(target).endswith(".tmp"):  # atomic_save's own moves, not those writing its files aside
            calls.append(target)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies here
        real_replace(source, target)
    monkeypatch.setattr(checkpoint.os, "replace", killed_at_the_second_move)
    with pytest.raises(KeyboardInterrupt):
        atomic_save(tmp_path / "last", {"w": torch.ones(2)}, {"n": 2})
    monkeypatch.setattr(checkpoint.os, "replace", real_replace)
    tensors, metadata = read_checkpoint(tmp_path / "last")  # finishes the interrupted save
    assert metadata["n"] == 2 and torch.equal(tensors["w"], torch.ones(2))
    assert not list(tmp_path.glob("*.tmp"))


def test_a_kill_before_the_first_move_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    atomic_save(tmp_path / "last", {"w": torch.zeros(2)}, {"n": 1})

    def killed(source, target):
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_save(tmp_path / "last", {"w": torch.ones(2)}, {"n": 2})
    monkeypatch.undo()
    tensors, metadata = read_checkpoint(tmp_path / "last")
    assert metadata["n"] == 1 and torch.equal(tensors["w"], torch.zeros(2))


def test_flipped_bytes_in_the_weights_are_refused(tmp_path):
    atomic_save(tmp_path / "best", {"w": torch.arange(64, dtype=torch.float32)}, {})
    weights = tmp_path / "best.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256 differs"):
        read_checkpoint(tmp_path / "best")


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path):
    atomic_save(tmp_path / "best", {"encoder.w": torch.tensor([1.0, float("nan")]), "b": torch.ones(1)}, {})
    with pytest.raises(CheckpointError, match="tensor 'encoder.w' holds NaN"):
        read_checkpoint(tmp_path / "best")


@pytest.mark.parametrize("edit, problem", [
    (lambda m: [m], "expected a JSON object, found a list"),
    (lambda m: {k: v for k, v in m.items() if k != "args"}, "field 'args' is missing"),
    (lambda m: {**m, "next_stage": "two"}, "field 'next_stage' must be int, found str"),
    (lambda m: {**m, "history": {}}, "field 'history' must be list"),
    # issue 39: fields of the right type that contradict the others
    (lambda m: {**m, "next_stage": 7}, "next_stage 7 does not follow the history's 1 stage(s) done"),
    (lambda m: {**m, "next_stage": 0}, "next_stage 0 does not follow the history's 1 stage(s) done"),
    (lambda m: {**m, "next_stage": -3}, "next_stage -3 does not follow"),
    (lambda m: {**m, "history": m["history"][:1]}, "next_stage 1 does not follow the history's 0 stage(s) done"),
    (lambda m: {**m, "history": [m["history"][0], "sst"]}, "history record 1 must be an object with a 'stage'"),
    (lambda m: {**m, "history": [m["history"][0], {**m["history"][1], "index": 5}]}, "history record 1 must be"),
    (lambda m: {**m, "history": [m["history"][0], {**m["history"][1], "sst_acc": "high"}]},
     "history record 1 (sst) holds a value that is not a number"),
    (lambda m: {**m, "history": [m["history"][0], {k: v for k, v in m["history"][1].items() if k != "sst_acc"}]},
     "history record 1 (sst) lacks metrics of the first record (sst_acc)"),
    (lambda m: {**m, "best_score": 3.5}, "best_score 3.5 is not a score in [0, 1]"),
    (lambda m: {**m, "updates": -1}, "updates must be a whole number >= 0, found -1"),
    (lambda m: {**m, "world_size": 0}, "world_size must be a whole number >= 1, found 0"),
    (lambda m: {**m, "smart_skipped_steps": {"sst": 1.5}}, "smart_skipped_steps['sst'] must be a whole number"),
    (lambda m: {**m, "block_best": {"index": 7, "score": 0.5}}, "block_best {'index': 7, 'score': 0.5} must name a "
     "stage done"),
])
def test_a_hand_edited_last_json_is_one_clear_line(tiny_checkpoint, tmp_path, capsys, edit, problem):
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    info = tmp_path / "run" / "last.json"
    info.write_text(json.dumps(edit(json.loads(info.read_text()))))
    capsys.readouterr()
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--resume")) == 2
    assert problem in one_error_line(capsys)


def test_a_removed_tensor_is_named(tiny_checkpoint, tmp_path, capsys):
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    prefix = tmp_path / "run" / "best"
    tensors = load_file(prefix.with_suffix(".safetensors"))
    metadata = json.loads(prefix.with_suffix(".json").read_text())
    del tensors["sentiment_head.bias"]
    atomic_save(prefix, tensors, {k: v for k, v in metadata.items() if k != "sha256"})
    with pytest.raises(CheckpointError, match="sentiment_head.bias"):
        load_multitask_model(prefix)


# -- the command lines ---------------------------------------------------------------------------------
# Every command line that reads flags (the course's scripts and scripts/*.py); optimizer_test.py reads --help alone.
COMMAND_LINES = sorted(path.relative_to(ROOT).as_posix() for path in [*ROOT.glob("*.py"), *ROOT.glob("scripts/*.py")]
                       if "parse_args(" in path.read_text(encoding="utf-8"))


def test_the_command_lines_are_all_found():
    assert {"multitask_classifier.py", "classifier.py", "predict.py", "scripts/sweep.py"} <= set(COMMAND_LINES)


@pytest.mark.parametrize("script", COMMAND_LINES)
def test_a_bad_command_line_is_one_error_line_in_every_script(script, capsys, monkeypatch):
    """argparse's own parser prints its usage block above the error (here: a missing required argument, or the
    unknown flag); the user gets one line and --help."""
    monkeypatch.setattr("sys.argv", [script, "--no_such_flag"])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    assert stopped.value.code == 2
    line = one_error_line(capsys)
    assert line.startswith(f"{Path(script).name}: error: ") and line.endswith("(see --help)"), line


def test_resume_before_any_checkpoint_says_to_start_without_it(tmp_path, capsys, model_must_not_load):
    assert mc.main(["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run"), "--resume"]) == 2
    assert "nothing to resume yet" in one_error_line(capsys)


@pytest.mark.parametrize("where", ["a data file", "another run's folder"])
def test_a_leaderboard_file_never_replaces_a_data_file_or_another_runs(tmp_path, capsys, model_must_not_load, where):
    """The run's own folder is its CSVs' default; a flag sending one onto a file the run reads, or into another
    run's folder (whose best.json records its CSVs as its own), is refused before anything loads."""
    data = tmp_path / "data"
    shutil.copytree(DEMO, data)
    other = tmp_path / "other"
    (other / "predictions").mkdir(parents=True)
    (other / "best.json").write_text("{}")
    target = {"a data file": data / "ids-sst-dev.csv", "another run's folder": other / "predictions" / "x.csv"}[where]
    assert mc.main(["--data_dir", str(data), "--output_dir", str(tmp_path / "run"), "--sst_dev_out", str(target)]) == 2
    assert one_error_line(capsys).startswith(f"error: --sst_dev_out {target}: ")


@pytest.mark.parametrize("second", ["--sst_test_out", "--sts_dev_out"])
def test_two_leaderboard_flags_on_one_file_are_refused(tmp_path, capsys, model_must_not_load, second):
    """The second file written would replace the first's rows."""
    same = tmp_path / "same.csv"
    assert mc.main(["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run"), "--sst_dev_out", str(same),
                    second, str(tmp_path / "sub" / ".." / "same.csv")]) == 2
    assert one_error_line(capsys).endswith("also the file of --sst_dev_out; give each its own file")
    assert not same.exists()


def test_every_seed_flag_is_refused_outside_the_generators_range_in_one_line(capsys):
    """A --seed that numpy's or torch's generator would refuse with a traceback once the work began (-1, 2**32) is
    the parser's one line. The scripts' --seed flags all parse with rng_seed (the training command lines check
    theirs with the other settings)."""
    import robustness
    from minbert.arguments import rng_seed
    assert rng_seed("0") == 0 and rng_seed(str(2**32 - 1)) == 2**32 - 1
    for value in ("-1", str(2**32), "1.5"):
        with pytest.raises(SystemExit) as exit_info:
            robustness.main([str(DEMO), "--seed", value])
        assert exit_info.value.code == 2 and "argument --seed: " in one_error_line(capsys)
    sources = [*ROOT.glob("*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("minbert/**/*.py")]
    parsed_otherwise = [f"{path.relative_to(ROOT)}:{number}" for path in sources
                        for number, line in enumerate(path.read_text().splitlines(), start=1)
                        if 'add_argument("--seed"' in line and "type=rng_seed" not in line]
    assert parsed_otherwise == []


def test_ctrl_c_says_how_to_continue(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0

    def interrupted(self, stages):
        raise KeyboardInterrupt
    monkeypatch.setattr(mc.Trainer, "train", interrupted)
    capsys.readouterr()
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--resume")) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "rerun the same command with --resume" in err and "Traceback" not in err


def test_ctrl_c_before_the_first_checkpoint_does_not_advise_resume(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    def interrupted(self, stages):
        raise KeyboardInterrupt
    monkeypatch.setattr(mc.Trainer, "train", interrupted)
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path)) == 130
    err = capsys.readouterr().err
    assert "there is nothing to resume" in err and "(without --resume)" in err and "Traceback" not in err


def test_stop_after_zero_stages_is_refused_it_would_leave_nothing_to_resume(tmp_path, capsys):
    assert exit_code(["--data_dir", str(DEMO), "--output_dir", str(tmp_path), "--stop_after_stages", "0"]) == 2
    assert "--stop_after_stages must be >= 1, got 0" in capsys.readouterr().err


def left_by_killed_saves(run) -> list:
    """What kills mid-save leave in a run's folder: partial folders (one holding safetensors' own temporary, as big
    as the weights) and a checkpoint's pending weights that never reached their JSON."""
    partial = run / ".last.safetensors.k1ll3d00.minbert-partial"
    partial.mkdir(parents=True)
    (partial / ".tmpAbC123").write_bytes(b"\0" * 4096)
    scores = run / "scores" / ".sst-dev.csv.k1ll3d00.minbert-partial"
    scores.mkdir(parents=True)
    (run / "stage_1.safetensors.tmp").write_bytes(b"\0" * 64)
    return [partial, scores, run / "stage_1.safetensors.tmp"]


@pytest.mark.parametrize("how", ["--resume", "fresh"])
def test_what_a_killed_save_left_is_removed_when_a_run_opens_its_folder(tiny_checkpoint, tmp_path, how, capsys):
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    left = left_by_killed_saves(tmp_path / "run")
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, *([how] if how == "--resume" else []))) == 0
    assert [path for path in left if path.exists()] == []
    if how == "--resume":
        assert "resuming after stage 1" in capsys.readouterr().out


def test_a_duplicate_stage_record_from_a_kill_is_dropped_on_resume(tiny_checkpoint, tmp_path):
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    # A kill after stage 2's log line and before its checkpoint: the record is in metrics.jsonl only.
    metrics.write_text("\n".join(lines + [json.dumps({"stage": "sts", "index": 2, "overall": 0.5})]) + "\n")
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--resume")) == 0
    stages = [json.loads(line)["stage"] for line in metrics.read_text().splitlines()]
    assert stages == ["pretrained", "sst", "sts"]


@pytest.mark.parametrize("where", ["output_dir", "prediction"])
def test_an_output_path_under_a_file_fails_before_the_model_loads(tmp_path, capsys, model_must_not_load, where):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    flags = ["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run")]
    flags += ["--output_dir", str(blocker / "run")] if where == "output_dir" else ["--sst_dev_out", str(blocker / "x.csv")]
    assert mc.main(flags) == 2
    assert "is a file, not a folder" in one_error_line(capsys)


@pytest.mark.parametrize("change, problem", [
    ({"num_attention_heads": 5}, "not a multiple of num_attention_heads 5"),
    ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ({"hidden_size": "32"}, "hidden_size must be a whole number"),
])
def test_a_bad_pretrained_config_is_one_line(tiny_checkpoint, tmp_path, capsys, change, problem):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, **change}))
    assert mc.main(quick_flags(broken, tmp_path)) == 2
    line = one_error_line(capsys)
    assert "config.json: cannot use the model config" in line and problem in line


def test_a_bad_tokenizer_json_is_one_line(tiny_checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read the tokenizer"):
        BertTokenizer.from_pretrained(broken)


def test_max_length_beyond_the_positions_fails_in_the_classifier_too(tmp_path, capsys):
    import classifier
    flags = ["--pretrained", "minilm-l6", "--data_dir", str(DEMO), "--max_length", "600",
             "--output_dir", str(tmp_path / "run"), "--predictions_dir", str(tmp_path / "p")]
    assert classifier.main(flags) == 2
    assert "--max_length 600 is longer than the 512 positions" in one_error_line(capsys)


def test_predictions_checkpoints_and_submissions_are_readable_by_other_users(tmp_path):
    previous = os.umask(0o022)
    try:
        predictions = tmp_path / "predictions"
        complete_predictions(predictions)
        atomic_save(tmp_path / "run" / "best", {"w": torch.zeros(2)}, {})
        assert prepare_submit.main(["--predictions_dir", str(predictions), "--out", str(tmp_path / "s.zip")]) == 0
    finally:
        os.umask(previous)
    written = [*predictions.iterdir(), tmp_path / "run" / "best.safetensors", tmp_path / "run" / "best.json",
               tmp_path / "s.zip"]
    assert len(written) == 9 and all(path.stat().st_mode & 0o777 == 0o644 for path in written)


# -- prepare_submit ------------------------------------------------------------------------------------


def complete_predictions(directory):
    for (task, split), path in prepare_submit.DEFAULT_OUTPUTS.items():
        ids = [e.id for e in load_examples(standard_paths(DEMO)[(task, split)], task, split)]
        write_predictions(directory / os.path.basename(path), ids, [2.5 if task == "sts" else 0] * len(ids), task)


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.write_text("id,Predicted_Sentiment\n"), "a header but no predictions"),
    (lambda p: p.write_text("\n".join(p.read_text().splitlines()[:3]) + "\n"), "missing ids"),
    (lambda p: p.write_text(p.read_text().replace(",0\n", ",7\n", 1)), "invalid Predicted_Sentiment value '7'"),
])
def test_prepare_submit_refuses_incomplete_or_invalid_files(tmp_path, capsys, damage, problem):
    predictions = tmp_path / "predictions"
    predictions.mkdir()
    complete_predictions(predictions)
    args = ["--predictions_dir", str(predictions), "--data_dir", str(DEMO), "--out", str(tmp_path / "s.zip")]
    assert prepare_submit.main(args) == 0
    damage(predictions / "sst-dev-out.csv")
    capsys.readouterr()
    assert prepare_submit.main(args[:-1] + [str(tmp_path / "t.zip")]) == 2
    line = one_error_line(capsys)
    assert "sst-dev-out.csv" in line and problem in line
    assert not (tmp_path / "t.zip").exists()


def test_a_resume_refuses_a_kept_model_that_is_not_its_runs(tiny_checkpoint, tmp_path, capsys):
    """Another run's best.* copied beside a stopped run's state would be finished and written out as its own."""
    for name, seed in (("a", "1"), ("b", "2")):
        assert mc.main(quick_flags(tiny_checkpoint, tmp_path / name, "--seed", seed, "--stop_after_stages", "1")) == 0
    theirs = {suffix: (tmp_path / "b" / "run" / f"best{suffix}").read_bytes() for suffix in (".json", ".safetensors")}
    for suffix, content in theirs.items():
        (tmp_path / "a" / "run" / f"best{suffix}").write_bytes(content)
    capsys.readouterr()
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path / "a", "--seed", "1", "--resume")) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: cannot resume: {tmp_path / 'a' / 'run' / 'best.json'} is not the kept model")
    assert {suffix: (tmp_path / "a" / "run" / f"best{suffix}").read_bytes() for suffix in theirs} == theirs


def test_resume_reads_the_data_by_content_not_by_path(tiny_checkpoint, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(DEMO, data)
    flags = quick_flags(tiny_checkpoint, tmp_path, "--keep_resume_state")  # the finished run is resumed last
    flags[flags.index("--data_dir") + 1] = str(data)
    assert mc.main(flags + ["--stop_after_stages", "1"]) == 0
    moved = tmp_path / "moved" / "data"
    shutil.move(data, moved)
    flags[flags.index("--data_dir") + 1] = str(moved) + "/"
    assert mc.main(flags + ["--stop_after_stages", "2", "--resume"]) == 0
    sts_dev = moved / "sts-dev.csv"
    lines = sts_dev.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace("\t", "\tchanged ", 2).replace("\tchanged ", "\t", 1)  # one sentence edited
    sts_dev.write_text("".join(lines))
    capsys.readouterr()
    assert mc.main(flags + ["--resume"]) == 2
    assert "data files' content differs" in one_error_line(capsys)


def test_dev_rows_without_a_label_are_named_in_the_end_of_run_summary(tiny_checkpoint, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(DEMO, data)
    lines = (data / "quora-dev.csv").read_text().splitlines(keepends=True)
    lines[2] = "\t".join(lines[2].rstrip("\n").split("\t")[:-1] + [""]) + "\n"  # the label cell emptied
    (data / "quora-dev.csv").write_text("".join(lines))
    flags = quick_flags(tiny_checkpoint, tmp_path)
    flags[flags.index("--data_dir") + 1] = str(data)
    assert mc.main(flags) == 0
    out = capsys.readouterr().out
    assert "note: not in the predictions: " in out and "quora-dev.csv: dropped 1 row(s)" in out
    assert len((tmp_path / "para-dev.csv").read_text().splitlines()) == 1 + 39


# -- flags that could not act, or were first checked once the model had loaded (issue 39) -------------------


@pytest.mark.parametrize("length, shortest", [("1", 5), ("4", 5)])
def test_a_max_length_the_tokenizer_cannot_cut_to_is_refused(tmp_path, capsys, model_must_not_load, length, shortest):
    # below [CLS] a [SEP] b [SEP] the tokenizer returns texts whole: a 700-word sentence then crashed the encoder
    assert exit_code(quick_flags("minilm-l6", tmp_path, "--max_length", length)) == 2
    line = capsys.readouterr().err.strip()
    assert f"--max_length must be >= {shortest}, got {length}" in line and "\n" not in line


def test_the_classifier_max_length_needs_room_for_a_token_too(tmp_path, capsys, model_must_not_load):
    import classifier
    with pytest.raises(SystemExit) as exit:
        classifier.main(["--data_dir", str(DEMO), "--max_length", "2", "--output_dir", str(tmp_path)])
    assert exit.value.code == 2
    assert "--max_length must be >= 3, got 2" in capsys.readouterr().err


def test_the_tokenizer_refuses_a_length_it_cannot_truncate_to(tokenizer):
    with pytest.raises(ValueError, match="max_length 2 cannot truncate"):
        tokenizer(["word " * 700], truncation=True, max_length=2)
    with pytest.raises(ValueError, match="max_length 4 cannot truncate"):
        tokenizer(["a"], ["b"], truncation=True, max_length=4)
    assert len(tokenizer(["word " * 700], truncation=True, max_length=3)["input_ids"][0]) == 3


QA_FLAGS = ["--tasks", "qa", "--qa_doc_stride", "8", "--qa_max_answer_tokens", "8"]


@pytest.mark.parametrize("extra, problem", [
    (["--qa_max_length", "100"], "--qa_max_length 100 is longer than the 64 positions"),
    (["--qa_max_length", "20"], "--qa_max_length 20 leaves"),  # the longest demo question leaves no room
    (["--max_length", "100"], "--max_length 100 is longer than the 64 positions"),
    (["--tasks", "sst", "--adapter", "pals", "--pal_size", "3"], "--pal_size 3 is not a multiple of the 2 attention"),
    (["--tasks", "sts", "--lnsr", "--lnsr_layer", "2"], "--lnsr_layer 2 leaves no layer"),
])
def test_flags_that_depend_on_the_model_are_checked_before_it_loads(tiny_checkpoint, tmp_path, capsys,
                                                                    model_must_not_load, extra, problem):
    flags = quick_flags(tiny_checkpoint, tmp_path, *QA_FLAGS, "--first_stages", "qa", "--cycle", "")
    if "--tasks" in extra:
        flags = quick_flags(tiny_checkpoint, tmp_path, "--first_stages", extra[1], "--cycle", "")
    assert mc.main(flags + extra) == 2
    assert problem in one_error_line(capsys)


def test_a_vocabulary_larger_than_the_embedding_table_is_refused_before_loading(tiny_checkpoint, tmp_path, capsys,
                                                                                 model_must_not_load):
    small = tmp_path / "small-vocabulary"
    shutil.copytree(tiny_checkpoint, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    assert mc.main(quick_flags(small, tmp_path)) == 2
    line = one_error_line(capsys)
    assert "the tokenizer has 30522 tokens but the model's embedding table has 1000 rows" in line


# -- a run folder describes one run (issue 39) --------------------------------------------------------------


def test_a_fresh_run_removes_what_an_earlier_run_left_and_nothing_else(tiny_checkpoint, tmp_path, capsys):
    run = tmp_path / "run"
    stale = [run / "scores" / "qqp-dev.csv", run / "scores" / "qa-train.safetensors", run / "best.json",
             run / "stage_7.safetensors", run / "last.json.tmp", run / "sst_tsne.png", run / "forgetting.md",
             run / "predictions" / "para-dev-out.csv", run / "predictions" / "squad-dev-out.json"]
    kept = [run / "notes.txt", run / "scores" / "mine.csv", run / "stage_x.json"]  # not a run's names
    for path in stale + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("an earlier run's")
    assert mc.main(quick_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    # 8: last.json.tmp, an interrupted save's, went first, when the run took the folder (checkpoint_folder)
    assert "the earlier run's 8 files there" in capsys.readouterr().out
    assert not any(path.exists() and path.read_text() == "an earlier run's" for path in stale)  # best.json: this run's
    assert all(path.exists() for path in kept)
    assert (run / "last.json").is_file() and (run / "best.json").is_file()


def test_every_file_a_run_writes_is_one_a_fresh_run_would_remove(tiny_checkpoint, tmp_path):
    run = tmp_path / "run"
    flags = quick_flags(tiny_checkpoint, tmp_path, "--score_train", "--keep_stage_models")
    for task in ("sst", "para", "sts"):
        for split in ("dev", "test"):
            flags += [f"--{task}_{split}_out", str(run / "predictions" / f"{task}-{split}-out.csv")]
    assert mc.main(flags) == 0
    written = {path for path in run.rglob("*") if path.is_file() and path.name != ".lock"}
    predictions = [run / "predictions" / f"{t}-{s}-out.csv" for t in ("sst", "para", "sts") for s in ("dev", "test")]
    assert written >= set(predictions) and any(path.parent.name == "scores" for path in written)
    assert written <= set(mc.earlier_run_files(run, predictions))  # (the figures are skipped here: no_plots)


def test_a_second_run_in_a_folder_in_use_is_refused(tiny_checkpoint, tmp_path, capsys, model_must_not_load):
    from minbert.files import locked_folder
    with locked_folder(tmp_path / "run"):
        assert mc.main(quick_flags(tiny_checkpoint, tmp_path)) == 2
    line = one_error_line(capsys)
    assert f"{tmp_path / 'run' / '.lock'}: another process is writing in this folder now" in line



def test_a_second_classifier_run_in_a_folder_in_use_is_refused(tmp_path, capsys, model_must_not_load):
    import classifier
    from minbert.files import locked_folder
    with locked_folder(tmp_path / "run"):
        assert classifier.main(["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run"),
                                "--predictions_dir", str(tmp_path / "p")]) == 2
    assert f"{tmp_path / 'run' / '.lock'}: another process is writing in this folder now" in one_error_line(capsys)

# -- outputs that cannot be written (issue 39) -----------------------------------------------------------


@pytest.fixture
def full_disk():
    """Files may grow to 64 KB at most, as on a nearly full disk: a bigger write fails (EFBIG), as it would with
    ENOSPC. Applied inside the `with` block of the fixture's value."""
    import contextlib
    import resource
    import signal

    @contextlib.contextmanager
    def limited():
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, handler)
    return limited


def test_a_full_disk_while_saving_a_checkpoint_is_one_line(tiny_checkpoint, tmp_path, capsys, full_disk):
    with full_disk():  # the tiny model's 4 MB of weights do not fit
        assert mc.main(quick_flags(tiny_checkpoint, tmp_path)) == 2
    line = one_error_line(capsys)
    assert f"{tmp_path / 'run' / 'best.safetensors'}: cannot write it (cannot save the tensors" in line
    assert "File too large" in line
    assert not list((tmp_path / "run").glob("*.tmp"))  # no partial file left behind


def test_a_full_disk_while_zipping_is_one_line_and_leaves_no_zip(tmp_path, capsys, full_disk, monkeypatch):
    predictions = tmp_path / "predictions"
    complete_predictions(predictions)
    monkeypatch.setattr(prepare_submit, "write_zip", lambda path, members: path.write_bytes(os.urandom(100_000)))
    with full_disk():
        assert prepare_submit.main(["--predictions_dir", str(predictions), "--data_dir", str(DEMO),
                                    "--out", str(tmp_path / "s.zip")]) == 2
    assert f"{tmp_path / 's.zip'}: cannot write it (File too large)" in one_error_line(capsys)
    assert not (tmp_path / "s.zip").exists() and not list(tmp_path.glob(".s.zip.*"))


@pytest.mark.parametrize("out, problem", [
    ("predictions/sst-dev-out.csv", "would replace it, which this command reads"),
    ("data/ids-sst-dev.csv", "would replace it, which this command reads"),
    ("run/submission.zip", "inside the run folder"),
    ("run_of_csvs/best.json", "would replace a file of the run"),
])
def test_prepare_submit_never_replaces_what_it_reads_or_writes_in_a_run(tmp_path, capsys, monkeypatch, out, problem):
    monkeypatch.chdir(tmp_path)
    complete_predictions(tmp_path / "predictions")
    shutil.copytree(DEMO, tmp_path / "data")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.json").write_text("{}")
    (tmp_path / "run_of_csvs").mkdir()  # the run whose CSVs are zipped: a zip beside them is allowed, not over its files
    (tmp_path / "run_of_csvs" / "best.json").write_text(json.dumps({"metrics": {}, "args": {}}))
    (tmp_path / "predictions").rename(tmp_path / "run_of_csvs" / "predictions")
    (tmp_path / "predictions").symlink_to(tmp_path / "run_of_csvs" / "predictions")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    assert prepare_submit.main(["--out", out]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: --out {out}: ") and problem in line
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
    assert prepare_submit.main(["--out", "run_of_csvs/submission.zip"]) == 0  # beside the run it zips: the notebook's


@pytest.mark.parametrize("make", [lambda path: None, lambda path: path.write_text("")])
def test_prepare_submit_refuses_a_named_data_dir_that_is_not_a_folder(tmp_path, capsys, make):
    make(tmp_path / "data")
    with pytest.raises(SystemExit) as exit_info:
        prepare_submit.main(["--predictions_dir", str(tmp_path), "--data_dir", str(tmp_path / "data")])
    assert exit_info.value.code == 2
    assert f"--data_dir {tmp_path / 'data'}: not a folder" in one_error_line(capsys)


def test_prepare_submit_out_that_is_a_folder_or_under_a_file_is_refused_first(tmp_path, capsys):
    for out, problem in ((tmp_path, "a folder; name the zip file"),
                         (tmp_path / "x.zip" / "s.zip", "is a file, not a folder")):
        (tmp_path / "x.zip").write_text("")
        assert prepare_submit.main(["--predictions_dir", str(tmp_path / "none"), "--out", str(out)]) == 2
        assert problem in one_error_line(capsys)  # before the (missing) predictions are read


def test_an_output_file_that_cannot_be_written_is_one_output_error(tmp_path):
    from minbert.files import OutputError, atomic_write_text
    (tmp_path / "taken").mkdir()  # a folder in the file's place
    with pytest.raises(OutputError, match=r"taken: cannot write it \(Is a directory\)"):
        atomic_write_text(tmp_path / "taken", "x")
    (tmp_path / "a_file").write_text("")  # a file in its folder's place
    with pytest.raises(OutputError, match=r"a_file/x.txt: cannot write it \("):
        atomic_write_text(tmp_path / "a_file" / "x.txt", "x")


def test_deeply_nested_checkpoint_and_config_json_are_one_line(tiny_checkpoint, tmp_path):
    from base_bert import BertConfig
    nested = "[" * 100_000 + "]" * 100_000
    atomic_save(tmp_path / "best", {"w": torch.zeros(1)}, {})
    (tmp_path / "best.json").write_text(nested)
    with pytest.raises(CheckpointError, match="best.json: not a checkpoint's JSON \\(nested too deeply"):
        read_checkpoint(tmp_path / "best")
    (tmp_path / "config.json").write_text(nested)
    with pytest.raises(CheckpointError, match="config.json: cannot use the model config \\(nested too deeply"):
        BertConfig.from_json_file(tmp_path / "config.json")


# -- messages that name what is wrong, not something else (issue 56) ------------------------------------------


def test_export_hf_given_a_run_folder_exports_its_kept_model(tiny_checkpoint, tmp_path, capsys):
    """A run's folder was "no checkpoint here"; it names the kept model (best), as predict.py reads it."""
    import export_hf
    from conftest import tiny_model
    from minbert.model.multitask_bert import save_multitask_model
    save_multitask_model(tiny_model(), tmp_path / "run" / "best", {"args": {"pretrained": str(tiny_checkpoint)}})
    assert export_hf.main([str(tmp_path / "run"), str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert export_hf.main([str(tmp_path / "out"), str(tmp_path / "again")]) == 2  # no kept model there
    assert one_error_line(capsys).startswith(f"error: {tmp_path / 'out'}: no kept model (best.json and "
                                             "best.safetensors)")


def test_stage_cka_names_a_run_given_twice_or_folders_of_one_name_not_names(tmp_path, capsys):
    """Without --names the folders' names name the results: a clash is theirs, not a --names never given."""
    import stage_cka
    a, b = tmp_path / "a" / "seed1", tmp_path / "b" / "seed1"
    for runs, problem in (([a, tmp_path / "a" / ".." / "a" / "seed1"], f"{tmp_path}/a/../a/seed1 is given twice"),
                          ([a, b], f"{a} and {b} share the folder name 'seed1'")):
        with pytest.raises(SystemExit) as refused:
            stage_cka.main([*map(str, runs), "--output_dir", str(tmp_path / "out")])
        line = one_error_line(capsys)
        assert refused.value.code == 2 and problem in line and "--names: give" not in line


def test_exports_plots_and_cka_never_write_into_another_runs_folder(tiny_checkpoint, tmp_path, capsys):
    """The one rule for writers (docs/runs.md) in the three tools that write beside runs: their own run's folder is
    allowed, another run's is refused in one line before any model loads."""
    import export_hf
    import plot_embeddings
    import stage_cka
    from conftest import tiny_model
    from minbert.model.multitask_bert import save_multitask_model
    run, other = tmp_path / "run", tmp_path / "other"
    for folder in (run, other):
        save_multitask_model(tiny_model(), folder / "best", {"args": {"pretrained": str(tiny_checkpoint)}})
        (folder / "args.json").write_text("{}")
    inside = other / "mine"
    for main in (lambda: export_hf.main([str(run), str(inside)]),
                 lambda: plot_embeddings.main([str(run / "best"), "--output", str(inside / "tsne.png")]),
                 lambda: stage_cka.main([str(run), "--output_dir", str(inside)])):
        try:
            code = main()
        except SystemExit as exit_:
            code = exit_.code
        assert code == 2
        assert one_error_line(capsys).endswith(f"inside the run folder {other}, whose files belong to that run; "
                                               "write elsewhere")
    assert not inside.exists()
    assert export_hf.main([str(run), str(run / "hf")]) == 0, capsys.readouterr().err  # its own run's folder
