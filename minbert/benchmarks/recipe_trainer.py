"""The Trainer that the recipes' training command line builds (scripts/_common.sh's flag arrays, through the same
run_setup functions as multitask_classifier.py), for the benchmarks that run real training steps (step_audit,
qqp_epoch).
"""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import torch

from base_bert import BertConfig, resolve_pretrained, to_hf_state_dict
from bert import BertModel
from minbert.benchmarks.models import RANDOM_WEIGHTS_TOKENIZER
from minbert.benchmarks.settings import ROOT, BenchmarkSettings


def recipe_flags(array: str) -> list[str]:
    """A flag array of scripts/_common.sh (CPU_FLAGS, GPU_FLAGS, SMART_FLAGS), as the recipes pass it."""
    script = f'source "{ROOT / "scripts" / "_common.sh"}" && printf "%s\\0" "${{{array}[@]}}"'
    return subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout.split("\0")[:-1]


def audit_training_argv(settings: BenchmarkSettings, smart: bool, pretrained: str, output_dir: str,
                        bf16_weights: bool = False) -> list[str]:
    """The training command line of the recipes for --device (cpu_sbert.sh's flags on the CPU, gpu_sbert.sh's on
    CUDA; cpu_ss.sh's and gpu_ss.sh's with SMART) with this benchmark's model, data, batch size, --seq_len as
    --max_length and precision (with `bf16_weights`: --precision bf16 --bf16_weights); --train_flags come last, so
    they win."""
    argv = recipe_flags("GPU_FLAGS" if torch.device(settings.device).type == "cuda" else "CPU_FLAGS")
    if smart:
        argv += recipe_flags("SMART_FLAGS")
    precision = "bf16" if bf16_weights else settings.requested_precision
    argv += ["--pretrained", pretrained, "--data_dir", settings.data_dir, "--batch_size", str(settings.batch_size),
             "--max_length", str(settings.seq_len), "--precision", precision,
             "--output_dir", output_dir,
             "--quiet"]
    if bf16_weights:
        argv.append("--bf16_weights")
    return argv + shlex.split(settings.train_flags)


def random_checkpoint(config: BertConfig, folder: Path) -> Path:
    """Random weights of `config` saved as a pretrained folder, with the bundled minilm-l6 tokenizer (the
    bert-base-uncased vocabulary): the training command line loads it as it loads any checkpoint."""
    from safetensors.torch import save_file
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config.to_dict()), encoding="utf-8")
    torch.manual_seed(0)
    save_file(to_hf_state_dict(BertModel(config).state_dict()), folder / "model.safetensors")
    tokenizer = resolve_pretrained(RANDOM_WEIGHTS_TOKENIZER)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, folder / name)
    return folder


def audit_trainer(settings: BenchmarkSettings, device: torch.device, smart: bool, pretrained: str, output_dir: str,
                  bf16_weights: bool = False):
    """The Trainer that multitask_classifier.py builds from the recipe's command line (audit_training_argv), through
    the same run_setup functions as its _run: flags parsed and checked, data loaded, the flags that depend on the
    model checked, the model built and placed on the device (packed or padded tokens, compiled layers), the
    Trainer; and the run's stages."""
    from minbert.run.run_setup import build_run, check_pretrained, load_inputs
    settings = training_settings(audit_training_argv(settings, smart, pretrained, output_dir, bf16_weights))
    stages, data, _, triplets, penalty_inputs = load_inputs(settings)
    return build_run(settings, stages, data, check_pretrained(settings, data), triplets, penalty_inputs,
                     device), stages


def training_settings(argv: list[str]):
    """multitask_classifier.py's settings of a command line (training_args.parse_training_args, its parser)."""
    from minbert.run.training_args import parse_training_args
    return parse_training_args(argv, "multitask_classifier.py's command line, as step_audit and qqp_epoch build it")
