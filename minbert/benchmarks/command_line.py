"""scripts/benchmark.py's flags: the benchmark kinds, the parser, and the checks that refuse a bad flag in one line
(exit code 2) before anything loads; parse_args gives the run's BenchmarkSettings.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from base_bert import CheckpointError
from minbert.arguments import OneLineErrorParser
from minbert.benchmarks.dev_eval import bench_dev_eval
from minbert.benchmarks.memory import bench_memory
from minbert.benchmarks.models import model_config, tokenizer_directory
from minbert.benchmarks.qqp_epoch import bench_qqp_epoch
from minbert.benchmarks.recipe_trainer import audit_training_argv, training_settings
from minbert.benchmarks.settings import ROOT, BenchmarkSettings
from minbert.benchmarks.step_audit import bench_step_audit, step_audit_lines
from minbert.benchmarks.throughput import (bench_data_parallel, bench_ensemble, bench_padding, bench_pipeline,
                                           bench_predict)
from minbert.benchmarks.training_steps import (bench_adapters, bench_captured_step, bench_checkpointing,
                                               bench_encoder, bench_precision, bench_smart)
from minbert.data.batches import standard_paths
from minbert.files import unwritable_folder
from minbert.runtime import COMPILE_MODES, PRECISIONS, requested_precision, resolve_precision
from minbert.tasks import MULTITASK
from tokenizer import BertTokenizer, shortest_max_length


BENCHMARKS = {"encoder": bench_encoder, "precision": bench_precision, "smart": bench_smart, "memory": bench_memory,
              "pipeline": bench_pipeline, "adapters": bench_adapters, "checkpointing": bench_checkpointing,
              "data_parallel": bench_data_parallel, "ensemble": bench_ensemble, "padding": bench_padding,
              "qqp_epoch": bench_qqp_epoch, "predict": bench_predict, "dev_eval": bench_dev_eval,
              "captured_step": bench_captured_step}
# Measurements of the data or of a whole epoch rather than of a step, and captured_step (on the CPU inductor's compile
# takes minutes): asked for by name, outside `all`.
ON_THEIR_OWN = {"padding", "qqp_epoch", "predict", "dev_eval", "captured_step"}
# Kinds that count rather than time, outside `all`; each prints lines of its own after its JSON, its summary last.
AUDITS = {"step_audit": bench_step_audit}
AUDIT_LINES = {"step_audit": step_audit_lines}
PROTOCOL_DATA = ROOT.parent / "shared" / "data" / "protocol"
DEMO_DATA = ROOT / "data" / "demo"
# The course files each kind reads from --data_dir (step_audit: the training command line checks its own).
DATA_FILES = {"pipeline": [("sst", "train")],
              "ensemble": [(task, split) for task in MULTITASK for split in ("dev", "test")],
              "padding": [(task, "train") for task in MULTITASK], "qqp_epoch": [("qqp", "train")],
              "predict": [("sst", "dev")], "dev_eval": [(task, "dev") for task in MULTITASK]}
# those that tokenize real text with --config's tokenizer
TEXT_KINDS = {"pipeline", "ensemble", "step_audit", "padding", "qqp_epoch", "predict", "dev_eval"}
# The shortest --seq_len that lets each kind act: the tokenizer's shortest cut for a text (pairs: step_audit's
# training may encode them jointly); random batches need rows of seq_len / 2 .. seq_len tokens, at least one each.
SHORTEST_SEQ_LEN = {"pipeline": shortest_max_length(1), "ensemble": shortest_max_length(1),
                    "step_audit": shortest_max_length(2), "padding": shortest_max_length(1),
                    "qqp_epoch": shortest_max_length(2), "predict": shortest_max_length(1),
                    "dev_eval": shortest_max_length(1)}
RANDOM_BATCH_SHORTEST_SEQ_LEN = 2


def whole_number(minimum: int):
    """An argparse type: a whole number >= minimum (argparse names the flag in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def device_flag(text: str) -> str:
    """An argparse type: a device these benchmarks run on that torch can see (cpu, cuda, cuda:N)."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"the benchmarks run on cpu or cuda, not {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise argparse.ArgumentTypeError(f"{text}: torch sees no CUDA device (torch {torch.__version__}, {build})")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return text


def chosen_kinds(which: str, device: torch.device) -> list[str]:
    """The kinds a run measures: `which`, or for all every timed kind that runs on the device (data_parallel
    measures gloo processes on the CPU)."""
    if which != "all":
        return [which]
    return [kind for kind in BENCHMARKS
            if kind not in ON_THEIR_OWN and (kind != "data_parallel" or device.type == "cpu")]


def check_arguments(parser: argparse.ArgumentParser, settings: BenchmarkSettings) -> None:
    """The checks that need several flags or the model's config.json (no weights): each bad flag is one line and
    exit code 2 (parser.error) before anything loads."""
    device = torch.device(settings.device)
    kinds = chosen_kinds(settings.which, device)
    if settings.which == "data_parallel" and device.type != "cpu":
        parser.error(f"--device {settings.device}: data_parallel measures gloo processes on the CPU; on GPUs time a "
                     "torchrun run instead")
    if "data_parallel" in kinds and settings.batch_size < 2:
        parser.error(f"--batch_size {settings.batch_size}: data_parallel splits it over 2 processes, so it must be "
                     ">= 2")
    shortest = max(SHORTEST_SEQ_LEN.get(kind, RANDOM_BATCH_SHORTEST_SEQ_LEN) for kind in kinds)
    if settings.seq_len < shortest:
        parser.error(f"--seq_len must be >= {shortest} for {settings.which}, got {settings.seq_len}")
    try:
        config = model_config(settings.config)
        if TEXT_KINDS & set(kinds):
            tokenizer = BertTokenizer.from_pretrained(tokenizer_directory(settings.config))
            tokenizer.check_fits(config.vocab_size, settings.config)
    except CheckpointError as err:
        parser.error(f"--config {settings.config}: {err}")
    if settings.seq_len > config.max_position_embeddings:
        parser.error(f"--seq_len {settings.seq_len} is longer than the {config.max_position_embeddings} positions of "
                     f"{settings.config}")
    data_dir = Path(settings.data_dir)
    if TEXT_KINDS & set(kinds) and not data_dir.is_dir():
        parser.error(f"--data_dir {data_dir}: not a folder")
    for task, split in sorted({pair for kind in kinds for pair in DATA_FILES.get(kind, [])}):
        path = standard_paths(data_dir)[(task, split)]
        if not path.is_file():
            parser.error(f"--data_dir {data_dir}: no {path.name} there (the {task} {split} file)")
    if settings.json is not None:
        problem = "a folder, not a file" if settings.json.is_dir() else unwritable_folder(settings.json.parent)
        if problem:
            parser.error(f"--json {settings.json}: {problem}")
    if settings.which == "captured_step" and settings.precision == "fp16":
        parser.error(f"--precision {settings.requested_precision} is fp16 here: --capture_step refuses fp16 (its "
                     "gradient scaler reads the gradients' finiteness back each step); use --precision bf16 or fp32")
    if settings.which == "step_audit":  # the training command line checks its own flags (one line, exit code 2)
        training = training_settings(audit_training_argv(settings, True, settings.config, "OUTPUT_DIR"))
        if training.compile:
            parser.error("--train_flags --compile: torch.compile does not run under the TorchDispatchMode that counts "
                         "the step's operators; step_audit counts the eager step, and its graph breaks say what "
                         "--compile can capture")


def benchmark_parser(description: str | None) -> OneLineErrorParser:
    """scripts/benchmark.py's parser; `description` is its --help text (the script's docstring)."""
    parser = OneLineErrorParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=[*BENCHMARKS, "all", *AUDITS])
    parser.add_argument("--config", default="minilm-l6", help="minilm-l6, a checkpoint, or random weights: "
                        "bert-base-random, random:NAME_OR_CONFIG_JSON")
    parser.add_argument("--device", type=device_flag, default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=whole_number(1), default=2)
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto: as training resolves it for the device (runtime.resolve_precision)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="alias: --bf16 is --precision bf16, --no-bf16 is --precision fp32")
    parser.add_argument("--batch_size", type=whole_number(1), default=32)
    parser.add_argument("--seq_len", type=whole_number(1), default=64,
                        help="tokens per sequence (step_audit: the training run's --max_length)")
    parser.add_argument("--warmup", type=whole_number(0), default=2, help="untimed steps per side")
    parser.add_argument("--steps", type=whole_number(1), default=3, help="timed steps per side per round")
    parser.add_argument("--rounds", type=whole_number(1), default=3)
    parser.add_argument("--data_dir", help=f"course files: pipeline reads ids-sst-train.csv, ensemble the dev and "
                        f"test files (default {PROTOCOL_DATA}); step_audit trains on it (default {DEMO_DATA})")
    parser.add_argument("--train_flags", default="", help="step_audit: more flags of the training command line, "
                        "after the recipe's, so they win; with an = as they start with --, e.g. "
                        "--train_flags='--gradient_checkpointing'")
    parser.add_argument("--compile", action="store_true", help="torch.compile minBERT's layers as --compile does in "
                        "training (encoder: transformers is timed compiled too)")
    parser.add_argument("--compile_mode", choices=COMPILE_MODES, default="default",
                        help="with --compile: torch.compile's mode, as --compile_mode in training (reduce-overhead: "
                        "CUDA graphs; give them --warmup 5 or more to record)")
    parser.add_argument("--token_layout", choices=("auto", "packed", "padded"), default="auto",
                        help="minBERT's bert.TokenLayout: auto as training places it (packed on the CPU, padded on "
                        "CUDA), or forced")
    parser.add_argument("--json", type=Path, help="also append the results to this JSON-lines file")
    return parser


def parse_args(argv=None, description: str | None = None) -> BenchmarkSettings:
    """The command line, checked, with --precision resolved for --device: settings.precision is bf16, fp16 or fp32
    and settings.requested_precision what was asked (auto, or --bf16 / --no-bf16 through their alias)."""
    parser = benchmark_parser(description)
    args = parser.parse_args(argv)
    if args.compile_mode != "default" and not args.compile:
        parser.error(f"--compile_mode {args.compile_mode}: only with --compile")
    if args.data_dir is None:
        args.data_dir = str(DEMO_DATA if args.which in AUDITS else PROTOCOL_DATA)
    try:
        args.requested_precision = requested_precision(args.precision, args.bf16)
    except ValueError as err:
        parser.error(str(err))
    args.precision = resolve_precision(torch.device(args.device), args.requested_precision)
    settings = BenchmarkSettings(**{name: value for name, value in vars(args).items() if name != "bf16"})
    check_arguments(parser, settings)
    return settings
