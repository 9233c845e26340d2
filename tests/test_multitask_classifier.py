"""multitask_classifier.py: whole command-line runs through main() on data/demo with a tiny random BERT."""
import json
import math
import shutil

import numpy as np
import pytest
import torch
from calibrate import main as calibrate_main
from safetensors.torch import load_file

import multitask_classifier as mc
from bert import BertModel
from conftest import DEMO, MAX_LENGTH, demo_examples, exit_code, output_flags
from evaluation import check_predictions_file
from minbert.data.batches import collate_pairs, collate_sentences
from minbert.model.multitask_bert import load_multitask_model
from minbert.run.run_setup import build_model

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")


def run_flags(checkpoint, out, *extra) -> list[str]:
    flags = ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
             "--max_train_examples", "24", "--max_length", str(MAX_LENGTH), "--batch_size", "8", "--lr", "1e-3",
             "--smart", "--first_stages", "qqp", "--cycle", "sts,sst:0.5", "--cycles", "1",
             "--keep_resume_state", "--output_dir", str(out / "run")]  # the tests compare training states
    for flag in output_flags().values():
        flags += [f"--{flag}", str(out / f"{flag}.csv")]
    return flags + list(extra)


def read_csv_outputs(out) -> dict[str, str]:
    return {flag: (out / f"{flag}.csv").read_text() for flag in output_flags().values()}


def read_records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def metrics_without_times(run) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in ("seconds", "eval_seconds")} for record in read_records(run)]


def assert_same_training_state(expected_run, got_run):
    expected = load_file(expected_run / "last.safetensors")
    got = load_file(got_run / "last.safetensors")
    assert expected.keys() == got.keys()
    assert any(k.startswith("teacher.") for k in expected) and any(k.startswith("optimizer.") for k in expected)
    for key in expected:
        if not key.startswith("rng."):  # the generators are compared by what they draw next, below
            assert torch.equal(expected[key], got[key]), key
    assert torch.equal(expected["rng.torch"], got["rng.torch"])


@pytest.fixture(scope="module")
def straight(tiny_checkpoint, tmp_path_factory):
    """One uninterrupted default run (read-only for the tests that compare with it). It draws its figures: a
    module fixture is set up before the tests' function-scoped no_plots, and test_end_to_end_with_smart checks them."""
    out = tmp_path_factory.mktemp("straight")
    assert mc.main(run_flags(tiny_checkpoint, out)) == 0
    return out


def test_end_to_end_with_smart(straight, tokenizer):
    run = straight / "run"
    written = {}
    for (task, split), flag in output_flags().items():
        ids = [e.id for e in demo_examples(task, split)]
        written[(task, split)] = check_predictions_file(straight / f"{flag}.csv", ids, task)
    records = read_records(run)
    assert [r["stage"] for r in records] == ["pretrained", "qqp", "sts", "sst@0.5"]
    assert all(math.isfinite(r["train_loss"]) for r in records[1:])
    assert all({"qqp_acc", "qqp_f1"} <= r.keys() and "para_acc" not in r for r in records)
    assert len(json.loads((run / "history.json").read_text())) == 4
    assert (run / "forgetting_matrix.png").stat().st_size > 0
    assert (run / "qqp_confusion_matrix.png").stat().st_size > 0
    assert (run / "sst_reliability.png").stat().st_size > 0 and (run / "qqp_reliability.png").stat().st_size > 0

    best = json.loads((run / "best.json").read_text())
    assert best["metrics"]["overall"] == max(r["overall"] for r in records[1:])
    model = load_multitask_model(run / "best").eval()
    sst, para, sts = (demo_examples(task, "dev") for task in ("sst", "qqp", "sts"))
    with torch.no_grad():
        sentiment = model("sst", collate_sentences(sst, tokenizer, MAX_LENGTH)).argmax(-1)
        duplicate = model("qqp", collate_pairs(para, tokenizer, MAX_LENGTH)) > 0
        similarity = model.objectives["sts"].score(model("sts", collate_pairs(sts, tokenizer, MAX_LENGTH)))
    assert [written[("sst", "dev")][e.id] for e in sst] == sentiment.tolist()
    assert [written[("qqp", "dev")][e.id] for e in para] == duplicate.long().tolist()
    np.testing.assert_allclose([written[("sts", "dev")][e.id] for e in sts], similarity.numpy(), atol=1e-4)


def test_the_runs_calibration_is_what_the_script_writes_from_its_saved_scores(straight, tmp_path):
    shutil.copytree(straight / "run" / "scores", tmp_path / "scores")
    assert calibrate_main([str(tmp_path), "--data_dir", str(DEMO)]) == 0
    written = json.loads((straight / "run" / "calibration.json").read_text())
    assert list(written["tasks"]) == ["sst", "qqp"] and "threshold" in written["tasks"]["qqp"]
    assert json.loads((tmp_path / "calibration.json").read_text()) == written


def test_a_dev_cap_above_every_dev_set_writes_the_same_files_as_no_cap(tiny_checkpoint, straight, tmp_path):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--max_eval_examples", "1000")) == 0
    assert read_csv_outputs(tmp_path) == read_csv_outputs(straight)
    assert [{k: v for k, v in r.items() if k != "dev_subset"} for r in metrics_without_times(tmp_path / "run")] == \
        metrics_without_times(straight / "run")


def test_a_capped_run_writes_every_dev_and_test_row(tiny_checkpoint, tmp_path):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--max_eval_examples", "5")) == 0
    for (task, split), flag in output_flags().items():
        check_predictions_file(tmp_path / f"{flag}.csv", [e.id for e in demo_examples(task, split)], task)
    assert [r["dev_subset"] for r in read_records(tmp_path / "run")] == [5, 5, 5, 5]
    assert "dev_subset" not in json.loads((tmp_path / "run" / "best.json").read_text())["metrics"]


# ---------------------------------------------------------------------------------------------------
# Resuming


def test_resume_ends_bitwise_equal_to_an_uninterrupted_run(tiny_checkpoint, straight, tmp_path):
    interrupted = tmp_path / "interrupted"
    assert mc.main(run_flags(tiny_checkpoint, interrupted, "--stop_after_stages", "2")) == 0
    assert json.loads((interrupted / "run" / "last.json").read_text())["next_stage"] == 2
    assert not (interrupted / "sst_dev_out.csv").exists()
    assert mc.main(run_flags(tiny_checkpoint, interrupted, "--resume")) == 0

    expected = load_file(straight / "run" / "last.safetensors")
    got = load_file(interrupted / "run" / "last.safetensors")
    assert expected.keys() == got.keys()
    assert any(k.startswith("teacher.") for k in expected) and any(k.startswith("optimizer.") for k in expected)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    assert metrics_without_times(straight / "run") == metrics_without_times(interrupted / "run")
    assert read_csv_outputs(straight) == read_csv_outputs(interrupted)


@pytest.mark.parametrize("spelling", ["moved, trailing slash", "relative with ./"])
def test_resume_from_a_moved_or_respelled_run_folder(tiny_checkpoint, straight, tmp_path, monkeypatch, spelling):
    out = tmp_path / "interrupted"
    assert mc.main(run_flags(tiny_checkpoint, out, "--stop_after_stages", "2")) == 0
    if spelling.startswith("moved"):
        shutil.move(out / "run", out / "moved")
        run, output_dir = out / "moved", str(out / "moved") + "/"
    else:
        monkeypatch.chdir(tmp_path)
        run, output_dir = out / "run", "./interrupted/run"
    assert mc.main(run_flags(tiny_checkpoint, out, "--resume", "--output_dir", output_dir)) == 0
    assert_same_training_state(straight / "run", run)
    assert metrics_without_times(straight / "run") == metrics_without_times(run)
    assert read_csv_outputs(straight) == read_csv_outputs(out)


def test_resume_with_a_different_setup_is_a_clear_error(tiny_checkpoint, tmp_path, capsys):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    flags = [f for f in run_flags(tiny_checkpoint, tmp_path, "--resume") if f != "--smart"]
    assert mc.main(flags + ["--pair_encoder", "cross"]) == 2
    assert "cannot resume: 2 flag(s) differ" in capsys.readouterr().err


def test_resume_with_fewer_cycles_equals_the_shorter_run(tiny_checkpoint, tmp_path):
    # A fixed SMART momentum: nothing in the run then depends on the total number of updates.
    short, cut = tmp_path / "short", tmp_path / "cut"
    assert mc.main(run_flags(tiny_checkpoint, short, "--cycles", "1", "--smart_momentum", "0.99")) == 0
    assert mc.main(run_flags(tiny_checkpoint, cut, "--cycles", "2", "--stop_after_stages", "2",
                             "--smart_momentum", "0.99")) == 0
    assert mc.main(run_flags(tiny_checkpoint, cut, "--cycles", "1", "--resume", "--smart_momentum", "0.99")) == 0
    assert read_csv_outputs(short) == read_csv_outputs(cut)


def test_resume_with_fewer_cycles_that_read_fewer_train_sets(tiny_checkpoint, tmp_path):
    # Stopped after the QQP stage of a run whose cycles would also train STS and SST; resumed with no cycles,
    # it has nothing left to train (the STS and SST train files are then not even read) and must end as a
    # run with no cycles does.
    flags = ["--smart_momentum", "0.99"]
    short, cut = tmp_path / "short", tmp_path / "cut"
    assert mc.main(run_flags(tiny_checkpoint, short, "--cycles", "0", *flags)) == 0
    assert mc.main(run_flags(tiny_checkpoint, cut, "--cycles", "1", "--stop_after_stages", "1", *flags)) == 0
    assert mc.main(run_flags(tiny_checkpoint, cut, "--cycles", "0", "--resume", *flags)) == 0
    assert read_csv_outputs(short) == read_csv_outputs(cut)


@pytest.mark.parametrize("schedule", [[], ["--smart_momentum", "0.99", "--lr_schedule", "linear"]],
                         ids=["scheduled SMART momentum", "linear learning rate"])
def test_changing_cycles_on_resume_is_refused_when_the_run_follows_its_total_updates(tiny_checkpoint, tmp_path,
                                                                                       capsys, schedule):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--cycles", "2", "--stop_after_stages", "2", *schedule)) == 0
    capsys.readouterr()
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--cycles", "1", "--resume", *schedule)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot resume" in lines[0] and "--cycles 2 -> 1" in lines[0]
    assert json.loads((tmp_path / "run" / "last.json").read_text())["next_stage"] == 2  # untouched


def test_resume_refuses_a_schedule_that_does_not_extend_the_stages_done(tiny_checkpoint, tmp_path, capsys):
    flags = ["--smart_momentum", "0.99"]  # so that --cycles may change at all
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--cycles", "2", "--stop_after_stages", "3", *flags)) == 0
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--cycles", "0", "--resume", *flags)) == 2
    assert "do not begin this run's schedule" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# Other schedules and options


def test_annealed_schedule_end_to_end(tiny_checkpoint, tmp_path):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--schedule", "annealed", "--epochs", "2",
                             "--max_train_examples", "16")) == 0
    records = read_records(tmp_path / "run")
    assert [r["stage"] for r in records] == ["pretrained", "multitask-1", "multitask-2"]
    for (task, split), flag in output_flags().items():
        check_predictions_file(tmp_path / f"{flag}.csv", [e.id for e in demo_examples(task, split)], task)


@pytest.mark.parametrize("schedule, surgery", [("round_robin", "pcgrad"), ("annealed", "cagrad")])
def test_gradient_surgery_runs_end_to_end(tiny_checkpoint, tmp_path, schedule, surgery):
    flags = ("--schedule", schedule, "--gradient_surgery", surgery, "--epochs", "1")
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *flags)) == 0
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [h["stage"] for h in history] == ["pretrained", "multitask-1"]


def test_gradient_surgery_needs_a_multitask_schedule(tiny_checkpoint, tmp_path, capsys):
    assert exit_code(run_flags(tiny_checkpoint, tmp_path, "--gradient_surgery", "pcgrad")) == 2
    assert "--gradient_surgery needs --schedule annealed or round_robin" in capsys.readouterr().err


def test_pretrain_option_freezes_bert_and_trains_the_heads(tiny_checkpoint, tmp_path):
    # The default schedule's STS stage has no trainable weight here (the SBERT cosine); it must not crash.
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--option", "pretrain")) == 0
    state = load_file(tmp_path / "run" / "last.safetensors")
    for key, value in BertModel.from_pretrained(tiny_checkpoint).state_dict().items():
        assert torch.equal(state[f"model.bert.{key}"], value), key
    trained_steps = json.loads((tmp_path / "run" / "last.json").read_text())["optimizer"]["steps"]
    assert len(trained_steps) == 4  # weight and bias of the sentiment and paraphrase heads


def test_simcse_stage_trains_the_encoder(tiny_checkpoint, tmp_path):
    triplets = tmp_path / "triplets.csv"
    triplets.write_text("premise,positive,negative\n"
                        "A man is playing a guitar.,A person plays music.,Nobody is playing anything.\n"
                        "Two kids run on the beach.,Children are outside.,The kids are asleep indoors.\n"
                        "A woman is cooking pasta.,Someone is making food.,A woman is swimming.\n"
                        "A dog catches a ball.,An animal is playing.,The dog is sleeping.\n")
    flags = run_flags(tiny_checkpoint, tmp_path, "--simcse_data", str(triplets), "--first_stages", "",
                      "--cycles", "0", "--simcse_lr", "1e-3", "--batch_size", "2")
    assert mc.main(flags) == 0
    records = read_records(tmp_path / "run")
    assert [r["stage"] for r in records] == ["pretrained", "simcse"] and math.isfinite(records[1]["train_loss"])
    trained = load_multitask_model(tmp_path / "run" / "best").bert.state_dict()
    initial = BertModel.from_pretrained(tiny_checkpoint).state_dict()
    assert not torch.equal(trained["encoder.layers.0.attention.qkv.weight"],
                           initial["encoder.layers.0.attention.qkv.weight"])
    assert torch.equal(trained["pooler.dense.weight"], initial["pooler.dense.weight"])  # unused: no gradient


def test_fp16_trains_with_a_gradient_scaler_and_resumes_bitwise(tiny_checkpoint, tmp_path, capsys):
    """--precision fp16 (a T4's): losses near float32's but not equal (the autocast is on), the scaler's state in
    the checkpoint, and a resumed run equal to an uninterrupted one. Without --smart, whose steps are float32."""
    def flags(out, *extra):
        return [f for f in run_flags(tiny_checkpoint, out, *extra) if f != "--smart"]
    assert mc.main(flags(tmp_path / "fp32", "--no-bf16")) == 0
    assert "precision: float32 (as asked (--precision))" in capsys.readouterr().out
    assert mc.main(flags(tmp_path / "fp16", "--precision", "fp16")) == 0
    assert "precision: fp16 autocast with a gradient scaler" in capsys.readouterr().out
    losses = {name: [r["train_loss"] for r in read_records(tmp_path / name / "run")[1:]] for name in ("fp32", "fp16")}
    assert losses["fp16"] != losses["fp32"]  # equal losses would mean the autocast was ignored
    np.testing.assert_allclose(losses["fp16"], losses["fp32"], rtol=0.1)
    straight = json.loads((tmp_path / "fp16" / "run" / "last.json").read_text())
    assert straight["grad_scaler"]["scale"] > 0 and "fp16_skipped_updates" in read_records(tmp_path / "fp16" / "run")[1]

    cut = tmp_path / "cut"
    assert mc.main(flags(cut, "--precision", "fp16", "--stop_after_stages", "2")) == 0
    assert mc.main(flags(cut, "--precision", "fp16", "--resume")) == 0
    resumed = json.loads((cut / "run" / "last.json").read_text())
    assert (resumed["grad_scaler"], resumed["skipped_updates"]) == (straight["grad_scaler"], straight["skipped_updates"])
    expected, got = load_file(tmp_path / "fp16" / "run" / "last.safetensors"), load_file(cut / "run" / "last.safetensors")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert metrics_without_times(tmp_path / "fp16" / "run") == metrics_without_times(cut / "run")


# ---------------------------------------------------------------------------------------------------
# The model the command line builds


def build_flags(checkpoint, *extra) -> list[str]:
    return ["--pretrained", str(checkpoint), "--max_length", str(MAX_LENGTH), *extra]


def encoder_dropouts(model) -> set[float]:
    return {module.p for module in model.bert.modules() if isinstance(module, torch.nn.Dropout)}


def test_hidden_dropout_prob_is_the_head_dropout_only(tiny_checkpoint):
    model = build_model(mc.parse_args(build_flags(tiny_checkpoint, "--hidden_dropout_prob", "0.3")),
                           trained={"sts"})
    assert model.dropout.p == 0.3
    assert model.bert.config.hidden_dropout_prob == 0.1  # the checkpoint's own (BertConfig's default)
    assert model.bert.embeddings.dropout.p == 0.1 and encoder_dropouts(model) == {0.1}


def test_encoder_dropout_sets_berts_dropout(tiny_checkpoint):
    args = mc.parse_args(build_flags(tiny_checkpoint, "--encoder_dropout", "0.2"))
    model = build_model(args, trained={"sts"})
    assert model.dropout.p == 0.3  # the course's default head dropout
    assert model.bert.config.hidden_dropout_prob == 0.2
    assert model.bert.embeddings.dropout.p == 0.2 and encoder_dropouts(model) == {0.2}
    assert model.bert.config.attention_probs_dropout_prob == 0.1


def test_pretrain_option_freezes_the_encoder_in_build_model(tiny_checkpoint, capsys):
    model = build_model(mc.parse_args(build_flags(tiny_checkpoint)), trained={"sst", "sts"})
    assert not any(p.requires_grad for p in model.bert.parameters())
    assert all(p.requires_grad for n, p in model.named_parameters() if not n.startswith("bert."))
    assert capsys.readouterr().out.splitlines() == [
        "note: with --option pretrain the STS cosine has no trainable weights; STS training steps change nothing"]


def test_max_length_beyond_the_model_positions_exits_2_before_training(tiny_checkpoint, tmp_path, capsys):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--max_length", "100")) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--max_length 100 is longer than the 64 positions" in lines[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---------------------------------------------------------------------------------------------------
# Bad input: one line, exit code 2, before the model loads


def test_demo_settings_are_defaults_that_explicit_flags_override():
    args = mc.parse_args(["--demo", "--cycles", "1", "--output", "elsewhere"])  # an abbreviated flag wins too
    assert (args.cycles, args.output_dir, args.smart, args.pretrained) == (1, "elsewhere", True, "minilm-l6")


def test_malformed_data_file_exits_2_naming_it_before_loading_the_model(tmp_path, capsys, model_must_not_load):
    data = tmp_path / "data"
    shutil.copytree(DEMO, data)
    broken = data / "sts-dev.csv"
    broken.write_text(broken.read_text() + "40\tabc\tone sentence\ta stray\tfield\t3.0\n")
    assert mc.main(["--data_dir", str(data), "--output_dir", str(tmp_path / "run"), "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(broken) in lines[0] and "tab-separated fields" in lines[0]


@pytest.mark.parametrize("flags, problem", [
    (["--first_stages", "qqp,mnli"], "unknown stage 'mnli'"),
    (["--smart", "--smart_override", "sst:ascent_steps=two"], "ascent_steps"),
    (["--smart", "--smart_tasks", "sst,nli"], "unknown task 'nli'"),
    (["--simcse_data", "nli.csv", "--option", "pretrain"], "use --option finetune"),
])
def test_bad_flags_exit_2_before_loading_the_model(tmp_path, capsys, model_must_not_load, flags, problem):
    assert exit_code(["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run"), *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0]


def test_simcse_without_triplets_exits_2(tmp_path, capsys, model_must_not_load):
    empty = tmp_path / "nli.csv"
    empty.write_text("premise,positive,negative\n")
    flags = ["--data_dir", str(DEMO), "--simcse_data", str(empty), "--option", "finetune",
             "--output_dir", str(tmp_path / "run")]
    assert mc.main(flags) == 2
    assert "no (premise, entailed, contradicted) triplets" in capsys.readouterr().err


# --- the leaderboard methods together ---------------------------------------------------------------

METHODS = ("--first_stages", "mlm:0.5,qqp", "--pair_encoder", "qqp:cross,sts:hybrid", "--sst_objective", "ordinal",
           "--head_hidden", "16", "--layerwise_lr_decay", "0.8", "--lnsr", "--lnsr_tasks", "sts,sst",
           "--lnsr_layer", "1", "--lr_schedule", "linear")


def test_every_method_at_once_trains_and_resumes_bitwise(tiny_checkpoint, tmp_path, capsys):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert mc.main(run_flags(tiny_checkpoint, straight, *METHODS)) == 0
    assert "has no MLM head; starting from a fresh one" in capsys.readouterr().out
    history = json.loads((straight / "run" / "history.json").read_text())
    assert [h["stage"] for h in history] == ["pretrained", "mlm@0.5", "qqp", "sts", "sst@0.5"]
    state = load_file(straight / "run" / "last.safetensors")
    assert any(k.startswith("mlm_head.") for k in state)
    assert not any(k.startswith("mlm_head.") for k in load_file(straight / "run" / "best.safetensors"))

    assert mc.main(run_flags(tiny_checkpoint, interrupted, *METHODS, "--stop_after_stages", "1")) == 0
    assert mc.main(run_flags(tiny_checkpoint, interrupted, *METHODS, "--resume")) == 0
    assert_same_training_state(straight / "run", interrupted / "run")
    assert read_csv_outputs(straight) == read_csv_outputs(interrupted)


def test_an_mlm_stage_needs_the_encoder_to_train(tiny_checkpoint, tmp_path, capsys, model_must_not_load):
    flags = run_flags(tiny_checkpoint, tmp_path, "--first_stages", "mlm", "--option", "pretrain")  # the last wins
    assert exit_code(flags) == 2
    assert "the mlm stage trains the encoder" in capsys.readouterr().err


def test_an_lnsr_layer_beyond_the_model_is_one_line(tiny_checkpoint, tmp_path, capsys):
    assert exit_code(run_flags(tiny_checkpoint, tmp_path, "--lnsr", "--lnsr_layer", "2")) == 2
    assert "--lnsr_layer 2 leaves no layer to measure in a 2-layer encoder" in capsys.readouterr().err


@pytest.mark.parametrize("adapter", [("--adapter", "dora", "--option", "pretrain"),
                                     ("--adapter", "pals", "--adapter_sharing", "shared")])
def test_adapters_train_and_resume_bitwise(tiny_checkpoint, tmp_path, adapter):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert mc.main(run_flags(tiny_checkpoint, straight, *adapter)) == 0
    assert mc.main(run_flags(tiny_checkpoint, interrupted, *adapter, "--stop_after_stages", "2")) == 0
    assert mc.main(run_flags(tiny_checkpoint, interrupted, *adapter, "--resume")) == 0
    assert_same_training_state(straight / "run", interrupted / "run")
    assert read_csv_outputs(straight) == read_csv_outputs(interrupted)
    best = json.loads((straight / "run" / "best.json").read_text())
    assert ("base" in best) == ("pretrain" in adapter)  # a frozen BERT is not saved, only its hash


def test_per_task_adapters_refuse_a_stage_that_trains_one_encoder_for_all(tiny_checkpoint, tmp_path, capsys):
    assert exit_code(run_flags(tiny_checkpoint, tmp_path, "--adapter", "lora", "--first_stages", "mlm")) == 2
    assert "with an adapter use --adapter_sharing shared" in capsys.readouterr().err


def test_mlm_epochs_come_first_on_a_multitask_schedule(tiny_checkpoint, tmp_path):
    flags = run_flags(tiny_checkpoint, tmp_path, "--schedule", "annealed", "--epochs", "1", "--mlm_epochs", "1")
    assert mc.main(flags) == 0
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [h["stage"] for h in history] == ["pretrained", "mlm", "multitask-1"]
