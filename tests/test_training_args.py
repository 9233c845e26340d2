"""training_args.py: the settings dataclasses, their validation, the parser built from them, SMART settings."""
import math
import os
import re
import subprocess
import sys

import pytest

import multitask_classifier as mc
from conftest import DEMO, ROOT, exit_code
from minbert.training.penalties.smart import regularized_tasks, smart_configs
from minbert.run.training_args import (ClassifierArguments, TrainingArguments, build_parser, data_paths, from_namespace,
                                       parse_training_args, prediction_paths, resume_free_fields)
from smart import SmartConfig

# ---------------------------------------------------------------------------------------------------
# Validation


INVALID = [
    (dict(lr=0.0), ["--lr", "0"], "--lr must be a finite number > 0"),
    (dict(lr=-1e-5), ["--lr=-1e-5"], "--lr must be a finite number > 0"),
    (dict(lr=math.nan), ["--lr", "nan"], "--lr must be a finite number > 0"),
    (dict(lr=math.inf), ["--lr", "inf"], "--lr must be a finite number > 0"),
    (dict(hidden_dropout_prob=1.5), ["--hidden_dropout_prob", "1.5"], "--hidden_dropout_prob must be in [0, 1)"),
    (dict(hidden_dropout_prob=-0.1), ["--hidden_dropout_prob", "-0.1"], "--hidden_dropout_prob must be in [0, 1)"),
    (dict(seed=-1), ["--seed", "-1"], "--seed must be in [0, 2**32)"),
    (dict(seed=2**40), ["--seed", str(2**40)], "--seed must be in [0, 2**32)"),
    (dict(num_workers=-1), ["--num_workers", "-1"], "--num_workers must be >= 0"),
    (dict(cycles=-1), ["--cycles", "-1"], "--cycles must be >= 0"),
    (dict(batch_size=0), ["--batch_size", "0"], "--batch_size must be >= 1"),
    (dict(grad_accumulation_steps=0), ["--grad_accumulation_steps", "0"], "--grad_accumulation_steps must be >= 1"),
    (dict(encoder_dropout=1.0), ["--encoder_dropout", "1"], "--encoder_dropout must be in [0, 1)"),
    (dict(warmup_ratio=1.0), ["--warmup_ratio", "1"], "--warmup_ratio must be in [0, 1)"),
    (dict(smart_momentum=1.0), ["--smart_momentum", "1"], "--smart_momentum must be in [0, 1)"),
    (dict(weight_decay=math.nan), ["--weight_decay", "nan"], "--weight_decay must be finite and >= 0"),
    (dict(gradient_surgery="pcgrad"), ["--gradient_surgery", "pcgrad"], "--gradient_surgery needs --schedule"),
    (dict(stage_start="best", schedule="annealed"), ["--stage_start", "best", "--schedule", "annealed"],
     "--stage_start best needs --schedule sequential"),
    (dict(cagrad_c=-1.0), ["--cagrad_c", "-1"], "--cagrad_c must be finite and >= 0"),
    (dict(layerwise_lr_decay=0.0), ["--layerwise_lr_decay", "0"], "--layerwise_lr_decay must be in (0, 1]"),
    (dict(head_hidden=-1), ["--head_hidden", "-1"], "--head_hidden must be >= 0"),
    (dict(ordinal_weight=-1.0), ["--ordinal_weight", "-1"], "--ordinal_weight must be finite and >= 0"),
    (dict(pair_encoder="qqp:bi"), ["--pair_encoder", "qqp:bi"], "--pair_encoder: pair encoder must be one of"),
    (dict(pair_encoder="sst:cross"), ["--pair_encoder", "sst:cross"], "TASK one of qqp, sts"),
    (dict(pair_encoder="sts:cross", similarity_objective="cosent"),
     ["--pair_encoder", "sts:cross", "--similarity_objective", "cosent"], "a cross-encoded STS"),
    (dict(adapter="lora", adapter_targets="query,gate"), ["--adapter", "lora", "--adapter_targets", "query,gate"],
     "--adapter lora: adapter targets must be some of"),
    (dict(adapter="dora", adapter_rank=0), ["--adapter", "dora", "--adapter_rank", "0"], "rank must be >= 1"),
    (dict(lnsr=True, lnsr_tasks="nli"), ["--lnsr", "--lnsr_tasks", "nli"], "--lnsr_tasks"),
    (dict(lnsr=True, lnsr_noise_std=0.0), ["--lnsr", "--lnsr_noise_std", "0"], "LNSR noise_std must be"),
    (dict(lnsr=True, lnsr_layer=-1), ["--lnsr", "--lnsr_layer", "-1"], "LNSR layer must be >= 0"),
    (dict(simcse_data=["nli.csv"]), ["--simcse_data", "nli.csv"], "use --option finetune"),
    # issue 39: flags that could not act, or whose first check lived deep in a module
    (dict(max_length=1), ["--max_length", "1"], "--max_length must be >= 5, got 1"),
    (dict(stop_after_stages=0), ["--stop_after_stages", "0"], "--stop_after_stages must be >= 1, got 0"),
    (dict(max_eval_examples=0), ["--max_eval_examples", "0"], "--max_eval_examples must be >= 1, got 0"),
    (dict(simcse_temperature=0.0), ["--simcse_temperature", "0"], "--simcse_temperature must be a finite number > 0"),
    (dict(simcse_temperature=math.nan), ["--simcse_temperature", "nan"], "--simcse_temperature must be a finite"),
    (dict(adapter="pals", pal_size=-12), ["--adapter", "pals", "--pal_size", "-12"], "--pal_size must be >= 1"),
    (dict(smart=True, smart_epsilon=-1.0), ["--smart", "--smart_epsilon", "-1"],
     "--smart_epsilon must be finite and >= 0 (0: no perturbation), got -1.0"),
    (dict(smart=True, smart_adv_weight=math.nan), ["--smart", "--smart_adv_weight", "nan"],
     "--smart_adv_weight must be finite and >= 0"),
    (dict(smart=True, smart_override=["sts:step_size=0"]), ["--smart", "--smart_override", "sts:step_size=0"],
     "--smart_override sts:step_size must be finite and > 0, got 0.0"),
]


@pytest.mark.parametrize("settings, flags, problem", INVALID, ids=[" ".join(f) for _, f, _ in INVALID])
def test_invalid_settings_are_value_errors(settings, flags, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        TrainingArguments(**settings)


@pytest.mark.parametrize("settings, flags, problem", INVALID, ids=[" ".join(f) for _, f, _ in INVALID])
def test_invalid_flags_exit_2_with_one_line_before_loading_the_model(tmp_path, capsys, model_must_not_load,
                                                                     settings, flags, problem):
    assert exit_code(["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run"), *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0]
    assert not (tmp_path / "run").exists()


SWITCHED_OFF = [
    (["--smart_reduction", "max"], "--smart_reduction does nothing without --smart"),
    (["--smart_reduction", "sum"], "--smart_reduction does nothing without --smart"),  # typed, though the default
    (["--smart_override", "sst:adv_weight=2"], "--smart_override does nothing without --smart"),
    (["--smart_anchor_mo", "train"], "--smart_anchor_mode does nothing without --smart"),  # abbreviated
    (["--smart_tasks", "sst"], "--smart_tasks does nothing without --smart"),
    (["--simcse_pairing", "product"], "--simcse_pairing does nothing without --simcse_data FILES"),
    (["--simcse_epochs", "2"], "--simcse_epochs does nothing without --simcse_data FILES"),
    (["--lnsr_weight", "0.1"], "--lnsr_weight does nothing without --lnsr"),
    (["--adapter_rank", "4"], "--adapter_rank does nothing without --adapter lora / dora / pals"),
    (["--compile_mode", "max-autotune"], "--compile_mode does nothing without --compile"),
    (["--warmup_ratio", "0.2"], "--warmup_ratio does nothing without --lr_schedule linear"),
    (["--cagrad_c", "0.3"], "--cagrad_c does nothing without --gradient_surgery cagrad"),
    (["--head_activation", "relu"], "--head_activation does nothing without --head_hidden N"),
    (["--ordinal_weight", "2"], "--ordinal_weight does nothing without --sst_objective ordinal"),
    (["--distill_weight", "0.3"], "--distill_weight does nothing without --distill or --distill_override (the "
                                  "distillation penalty is off)"),
    (["--score_train", "--distill_temperature", "2"], "--distill_temperature does nothing without --distill or "
                                                      "--distill_override (the distillation penalty is off)"),
    (["--ewc_fisher_batches", "5"], "--ewc_fisher_batches does nothing without --ewc_weight (the ewc penalty is off)"),
    (["--qa_n_best", "3"], "--qa_n_best does nothing without qa in --tasks"),
]


@pytest.mark.parametrize("flags, problem", SWITCHED_OFF, ids=[" ".join(f) for f, _ in SWITCHED_OFF])
def test_a_features_flag_without_its_switch_is_refused_in_one_line(capsys, flags, problem):
    with pytest.raises(SystemExit) as exit_info:
        parse_training_args(flags, None)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].endswith(f"error: {problem} (see --help)")


@pytest.mark.parametrize("flags", [
    ["--smart", "--smart_reduction", "max"], ["--demo", "--smart_anchor_mode", "train"],
    ["--smart", "--smart_override", "sst:adv_weight=2", "--no-smart"], ["--adapter", "none", "--adapter_rank", "4"],
    ["--lnsr", "--lnsr_weight", "0.1"], ["--lr_schedule", "linear", "--warmup_ratio", "0.2"],
    ["--head_hidden", "64", "--head_activation", "relu"], ["--option", "finetune", "--ewc_weight", "1", "--ewc_fisher_batches", "5"],
    ["--distill", "teacher", "--distill_weight", "0.3"], ["--tasks", "sst,qqp,sts,qa", "--qa_n_best", "3"],
    ["--tasks", "sts", "--sst_objective", "ordinal"], ["--lr_schedule", "constant", "--warmup_ratio", "0.2"],
    ["--simcse_data", "nli.jsonl", "--option", "finetune", "--simcse_pairing", "product"]])
def test_a_features_flag_is_accepted_with_its_switch_on_or_named_off(flags):
    """A switch named off says so knowingly: a recipe's SMART flags with --no-smart after them (table 4.11)."""
    parse_training_args(flags, None)


def test_a_config_naming_a_features_flag_without_its_switch_is_refused_unless_it_names_the_switch(tmp_path, capsys):
    config = tmp_path / "recipe.json"
    config.write_text('{"smart_reduction": "max"}')
    with pytest.raises(SystemExit):
        parse_training_args(["--config", str(config)], None)
    assert (f"error: --smart_reduction does nothing without --smart (--smart_reduction from --config {config})"
            in capsys.readouterr().err)
    config.write_text('{"smart": false, "smart_reduction": "max"}')  # as every run record names them
    assert parse_training_args(["--config", str(config)], None).smart_reduction == "max"
    assert parse_training_args(["--config", str(config), "--smart"], None).smart


def test_classifier_arguments_share_the_common_checks():
    with pytest.raises(ValueError, match="--lr must be a finite number > 0"):
        ClassifierArguments(lr=math.nan)
    with pytest.raises(ValueError, match="--seed must be in"):
        ClassifierArguments(seed=2**32)
    assert ClassifierArguments(seed=2**32 - 1).seed == 2**32 - 1  # the largest seed numpy takes


def test_valid_edge_values_are_accepted():
    for settings in (dict(seed=0, hidden_dropout_prob=0.0, cycles=0, num_workers=0, smart_momentum=0.0,
                          warmup_ratio=0.0),
                     dict(seed=2**32 - 1, gradient_surgery="pcgrad", schedule="round_robin"),
                     dict(gradient_surgery="cagrad", schedule="annealed", cagrad_c=0.0, layerwise_lr_decay=1.0),
                     dict(pair_encoder="quora:cross,sts:hybrid", lnsr=True, lnsr_layer=0, head_hidden=0),
                     dict(simcse_data=["nli.csv"], option="finetune")):
        args = TrainingArguments(**settings)  # no ValueError
        # Accepted as given: no edge value is clamped or replaced by a default on the way in.
        assert {name: getattr(args, name) for name in settings} == settings


# ---------------------------------------------------------------------------------------------------
# The parser


def test_help_lists_every_group_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exit:
        mc.main(["--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    for expected in ("course options", "model heads", "optimisation", "schedule", "SMART", "SimCSE",
                     "--encoder_dropout", "--lr_schedule", "--warmup_ratio", "--para_train", "--sts_test_out",
                     "SQuAD 2.0", "--tasks", "--squad_train", "--squad_test_out", "--qa_doc_stride"):
        assert expected in text


def test_help_shows_the_common_flags_first_and_the_per_file_paths_last(capsys):
    """Issue 59: --help opened on eighteen per-file paths; what most runs set comes first."""
    with pytest.raises(SystemExit):
        mc.main(["--help"])
    text = capsys.readouterr().out
    sections = [line for line in text.split("\n\n") if line and not line.startswith(("usage:", " "))]
    headings = [section.splitlines()[0] for section in sections if section.splitlines()[0].endswith(":")]
    assert headings[1].startswith("common: ") and headings[-1].startswith("the course's per-file paths")
    common = sections[[s.splitlines()[0] for s in sections].index(headings[1])]
    for flag in ("--demo", "--data_dir", "--tasks", "--pretrained", "--output_dir", "--use_gpu"):
        assert f"  {flag}" in common, flag
    assert "--sst_train" in sections[-1] and "--sst_train" not in common


def test_parsed_defaults_are_the_dataclass_defaults():
    parsed = from_namespace(TrainingArguments, build_parser(TrainingArguments).parse_args([]))
    default = TrainingArguments()
    for name, value in vars(default).items():
        if name not in ("data_files", "prediction_files"):
            assert getattr(parsed, name) == value, name
    # None: the run's own folder (prediction_paths), never a file another run's defaults wrote
    assert parsed.prediction_files == dict.fromkeys(["sst_dev_out", "sst_test_out", "para_dev_out", "para_test_out",
                                                     "sts_dev_out", "sts_test_out", "squad_dev_out", "squad_test_out"])
    assert (parsed.hidden_dropout_prob, parsed.encoder_dropout, parsed.smart_momentum) == (0.3, None, None)
    assert (parsed.lr_schedule, parsed.warmup_ratio, parsed.weight_decay) == ("constant", 0.1, 0.0)


def test_flags_reach_their_fields():
    args = mc.parse_args(["--para_train", "q.csv", "--sts_dev_out", "out/sts.csv", "--lr", "2e-5", "--bf16",
                          "--smart", "--smart_override", "sst:adv_weight=2", "--smart_override", "qqp:norm=l2",
                          "--simcse_data", "a.csv", "b.csv", "--option", "finetune", "--encoder_dropout", "0.2"])
    assert args.data_files["para_train"] == "q.csv" and args.prediction_files["sts_dev_out"] == "out/sts.csv"
    assert (args.lr, args.bf16, args.encoder_dropout) == (2e-5, True, 0.2)
    assert args.smart_override == ["sst:adv_weight=2", "qqp:norm=l2"] and args.simcse_data == ["a.csv", "b.csv"]


@pytest.mark.parametrize("flags, precision", [([], "auto"), (["--precision", "fp16"], "fp16"), (["--bf16"], "bf16"),
                                              (["--no-bf16"], "fp32"), (["--bf16", "--precision", "bf16"], "bf16")])
def test_bf16_flags_are_aliases_of_precision(flags, precision):
    assert mc.parse_args(flags).precision == precision


def test_a_bf16_flag_that_contradicts_precision_is_refused():
    with pytest.raises(ValueError, match="--no-bf16 contradicts --precision fp16"):
        TrainingArguments(bf16=False, precision="fp16")


def test_data_and_prediction_paths(tmp_path):
    args = mc.parse_args(["--data_dir", str(tmp_path), "--para_train", "elsewhere/q.csv",
                          "--sst_test_out", "out/sst.csv"])
    paths = data_paths(args.data_dir, args.data_files, ("sst", "qqp", "sts"))
    assert len(paths) == 9
    assert paths[("qqp", "train")].as_posix() == "elsewhere/q.csv"
    assert paths[("qqp", "dev")] == tmp_path / "quora-dev.csv"
    assert paths[("sst", "test")] == tmp_path / "ids-sst-test-student.csv"
    outputs = prediction_paths(args.prediction_files, "runs/a")
    assert outputs[("sst", "test")].as_posix() == "out/sst.csv"
    assert outputs[("qqp", "dev")].as_posix() == "runs/a/predictions/para-dev-out.csv"


def test_two_runs_from_one_folder_write_their_own_csvs():
    first, second = (mc.parse_args(["--output_dir", name]) for name in ("runs/a", "runs/b"))
    assert prediction_paths(first.prediction_files, first.output_dir)[("sst", "dev")] != \
        prediction_paths(second.prediction_files, second.output_dir)[("sst", "dev")]


def test_resume_free_fields_are_those_that_cannot_change_the_result():
    free = resume_free_fields(TrainingArguments)
    assert {"output_dir", "prediction_files", "resume", "stop_after_stages", "quiet", "num_workers", "demo",
            "cycles"} <= free  # each proven in test_resume_free_flags.py
    assert not free & {"eval_batch_size", "use_gpu", "precision", "compile_mode", "capture_step", "lr", "seed",
                       "smart", "smart_momentum", "lr_schedule", "warmup_ratio", "hidden_dropout_prob",
                       "encoder_dropout", "weight_decay", "grad_accumulation_steps", "first_stages", "cycle",
                       "batch_size", "max_length", "pretrained", "schedule", "gradient_surgery", "option",
                       "pair_encoder", "sst_objective", "ordinal_weight", "head_hidden", "lnsr",
                       "layerwise_lr_decay", "cagrad_c", "adapter", "adapter_rank", "adapter_sharing"}


# ---------------------------------------------------------------------------------------------------
# SMART settings


def test_smart_configs_apply_flags_then_per_task_overrides():
    args = TrainingArguments(smart=True, smart_epsilon=1e-4,
                             smart_override=["sst:adv_weight=10,ascent_steps=2", "quora:norm=l2"])
    configs = smart_configs(args)
    assert configs["sts"] == SmartConfig(epsilon=1e-4)
    assert configs["sst"] == SmartConfig(epsilon=1e-4, adv_weight=10.0, ascent_steps=2)
    assert configs["qqp"] == SmartConfig(epsilon=1e-4, norm="l2")
    assert set(configs) == {"sst", "qqp", "sts"}


@pytest.mark.parametrize("override, problem", [
    ("sst", "expected TASK:key=value"), ("mnli:adv_weight=1", "expected TASK:key=value"),
    ("sst:anchor_momentum=0.5", "shared setting 'anchor_momentum'"), ("sst:alpha=1", "unknown or shared"),
    ("sst:ascent_steps=two", "ascent_steps must be a int"), ("sts:epsilon=-1", "epsilon must be finite and >= 0"),
])
def test_smart_override_errors(override, problem):
    with pytest.raises(ValueError, match=problem):
        smart_configs(TrainingArguments(smart=True, smart_override=[override]))


def test_regularized_tasks():
    assert regularized_tasks(TrainingArguments(smart_tasks="sst")) == ()
    assert regularized_tasks(TrainingArguments(smart=True, smart_tasks="qqp, sts")) == ("qqp", "sts")
    assert regularized_tasks(TrainingArguments(smart=True, smart_tasks="para,sst")) == ("sst", "qqp")
    with pytest.raises(ValueError, match="unknown task 'nli'"):
        regularized_tasks(TrainingArguments(smart=True, smart_tasks="sst,nli"))


def test_smart_and_lnsr_tasks_come_in_the_run_order_whatever_the_hash_seed():
    """SMART's regularizers, and so the smart_skipped_steps of every checkpoint, are keyed in the run's task order:
    a set's order changes with the process's string hashes (under each of these seeds a set of the three iterates
    in another order than the run's), and last.json with it."""
    code = ("from minbert.training.penalties.lnsr import lnsr_tasks\n"
            "from minbert.training.penalties.smart import regularized_tasks\n"
            "from minbert.run.training_args import TrainingArguments\n"
            "args = TrainingArguments(smart=True, smart_tasks='sts,qqp,sst', lnsr=True, lnsr_tasks='sts,qqp,sst')\n"
            "print(','.join(regularized_tasks(args)), ','.join(lnsr_tasks(args)))")
    for seed in ("0", "1", "3", "5"):
        printed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        assert printed.split() == ["sst,qqp,sts", "sst,qqp,sts"], f"PYTHONHASHSEED={seed}"


def test_compile_must_match_on_resume_its_cpu_buckets_change_the_training():
    """--compile pads the CPU's batches to buckets of 8 tokens (pad_to_multiple_of), which changes the attention
    dropout masks a step draws (and AdamW's compiled update rounds differently): not a resume-free setting."""
    import dataclasses

    import torch

    from base_bert import CheckpointError
    from minbert.run.training_args import check_resume_arguments
    from minbert.runtime import pad_to_multiple_of
    cpu = torch.device("cpu")
    assert pad_to_multiple_of(cpu, compiled=True) != pad_to_multiple_of(cpu, compiled=False)
    assert "compile" not in resume_free_fields(TrainingArguments)
    with pytest.raises(CheckpointError, match="--compile False -> True"):
        check_resume_arguments(dataclasses.asdict(TrainingArguments()), TrainingArguments(compile=True))


def test_a_resume_may_change_cycles_unless_the_lr_or_the_bregman_anchor_follows_the_updates():
    """--cycles changes the number of updates: refused where the linear rate or SMART's run-long momentum follows
    it, allowed for SMART without a Bregman term (no anchor, so no momentum)."""
    import dataclasses

    from base_bert import CheckpointError
    from minbert.run.training_args import check_resume_arguments

    def resume(**settings):
        saved = dataclasses.asdict(TrainingArguments(cycles=2, **settings))
        check_resume_arguments(saved, TrainingArguments(cycles=3, **settings))

    resume(smart=True, smart_bregman_weight=0.0)
    resume()
    for settings in (dict(smart=True), dict(lr_schedule="linear"),
                     dict(smart=True, smart_bregman_weight=0.0, smart_override=["sst:bregman_weight=1"])):
        with pytest.raises(CheckpointError, match="--cycles 2 -> 3 changes the total number of updates"):
            resume(**settings)


def test_compile_on_a_cpu_warns_once_in_one_line(tiny_checkpoint, tmp_path, monkeypatch, capsys, no_plots):
    """torch.compile's inductor spends minutes per graph on a CPU (the demo ran over 10x slower than eager) and
    nothing said so. The compiling itself is replaced by the identity: what is tested is the word, said once."""
    import torch

    from conftest import prediction_flags
    monkeypatch.setattr(torch, "compile", lambda function, **options: function)
    flags = ["--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
             "--max_train_examples", "8", "--max_length", "32", "--first_stages", "sst", "--cycles", "0", "--compile",
             "--output_dir", str(tmp_path / "run"), *prediction_flags(tmp_path)]
    assert mc.main(flags) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "--compile" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: --compile on a CPU:"), warnings
    assert "leave --compile off on a CPU" in warnings[0]
    assert mc.main([flag for flag in flags if flag != "--compile"]) == 0
    assert "--compile" not in capsys.readouterr().err


def test_print_config_fed_back_to_config_reproduces_the_runs_args(tiny_checkpoint, tmp_path, capsys, no_plots):
    """--print_config prints what a command line resolves to (--demo's defaults included) as --config reads it, and
    trains nothing; that JSON given to --config trains the same run: its args.json "args" are the direct run's."""
    import json
    command = ["--demo", "--pretrained", str(tiny_checkpoint), "--quiet", "--max_train_examples", "8",
               "--max_length", "32", "--first_stages", "sst", "--cycles", "0", "--no-smart",
               "--output_dir", str(tmp_path / "direct")]
    with pytest.raises(SystemExit) as stopped:
        mc.main([*command, "--print_config"])
    assert stopped.value.code == 0 and not (tmp_path / "direct").exists()
    printed = json.loads(capsys.readouterr().out)
    assert printed["demo"] and printed["pretrained"] == str(tiny_checkpoint) and printed["cycles"] == 0
    assert mc.main(command) == 0
    recorded = json.loads((tmp_path / "direct" / "args.json").read_text())["args"]
    assert printed == recorded
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**printed, "output_dir": str(tmp_path / "again")}))
    assert mc.main(["--config", str(config)]) == 0
    again = json.loads((tmp_path / "again" / "args.json").read_text())["args"]
    assert again == {**recorded, "output_dir": str(tmp_path / "again")}
