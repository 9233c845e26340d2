"""The CPU recipe scripts (the commands behind RESULTS.md's rows) run end to end on the demo data, each
cut to a few examples and on a tiny random BERT instead of minilm-l6 (slow): a recipe that no longer matches
the command line fails here, not after hours.
The GPU recipes' command lines parse, and every recipe's outputs go under RUNS_DIR (the tests': a tmp folder)."""
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import DEMO
from minbert.data.batches import load_examples
from minbert.data.scores import scores_path, write_scores
from minbert.run.training_args import (TrainingArguments, adapter_config, build_parser, from_namespace,
                                       parse_training_args, run_tasks)
from minbert.training.penalties.smart import smart_configs
from minbert.tasks import MULTITASK, TASKS, course_file_name
from minbert.training.schedules import build_schedule

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--max_train_examples", "16", "--max_length", "32", "--quiet"]
SHORT_QA = ["--qa_max_length", "64", "--qa_doc_stride", "16"]
RECIPES = {  # recipe -> (extra flags that keep it short, environment)
    "cpu_sbert.sh": (["--cycles", "1"], {}),
    "cpu_ss.sh": (["--cycles", "1"], {}),
    "cpu_annealed.sh": (["--epochs", "1"], {}),
    "cpu_adapters.sh": (["--cycles", "1"], {"ADAPTER": "dora"}),
    "cpu_best.sh": (["--cycles", "1"], {}),
    "cpu_single_task.sh": ([], {"TASKS": "sts"}),
    "cpu_simcse_sbert.sh": (["--cycles", "1", "--simcse_max_examples", "16"], {}),
    "cpu_sss.sh": (["--cycles", "1", "--simcse_max_examples", "16"], {}),
    "cpu_thesis_sbert.sh": (["--first_stages", "qqp,sts*2,sst*2"], {}),
    "cpu_thesis_ss.sh": (["--first_stages", "qqp,sts*2,sst*2"], {}),
    "cpu_thesis_ss_cycles.sh": (["--cycles", "1"], {}),
    "cpu_thesis_sss.sh": (["--cycles", "1", "--simcse_max_examples", "16"], {}),
    "cpu_squad.sh": (["--first_stages", "qa", *SHORT_QA], {}),
    "cpu_four_tasks.sh": (["--epochs", "1", *SHORT_QA], {}),
    "cpu_distill.sh": (["--cycles", "1"], {}),  # TEACHER: made by recipe_runs
    "cpu_best_one_task.sh": ([], {"TASK": "qqp"}),
    "cpu_forgetting_study.sh": ([], {"DEFENCE": "ewc"}),
}
OUTPUTS = {"cpu_squad.sh": 2, "cpu_four_tasks.sh": 8, "cpu_best_one_task.sh": 2}  # predictions files, when not the six CSVs
# Every recipe that launches training (through $LAUNCH); cpu_ensemble.sh runs scripts/ensemble.py,
# cpu_robustness_study.sh the robustness suite on finished runs, gpu_check.sh the checks.
TRAINING_RECIPES = sorted(p.name for p in (ROOT / "scripts").glob("[cg]pu_*.sh")
                          if p.name not in ("cpu_ensemble.sh", "cpu_robustness_study.sh", "gpu_check.sh"))


def needs_nli(recipe: str) -> bool:
    return "simcse" in recipe or "sss" in recipe


@pytest.fixture(scope="module")
def recipe_runs(tmp_path_factory, tiny_checkpoint) -> dict:
    """Every CPU recipe, run two at a time (each single-threaded: one per core): recipe -> (result, runs folder).
    The SimCSE recipes read ../shared/data/nli; without it they are not run."""
    runs = tmp_path_factory.mktemp("recipes")
    nli = (ROOT.parent / "shared" / "data" / "nli").is_dir()
    teacher = runs / "teacher"  # cpu_distill.sh's: scores of every demo training example
    for task in MULTITASK:
        ids = [e.id for e in load_examples(DEMO / course_file_name(task, "train"), task, "train")]
        columns = len(TASKS[task].outputs.score_columns)
        write_scores(scores_path(teacher, task, "train"), ids, np.linspace(0, 4, len(ids) * columns), task)

    def run(recipe: str):
        flags, environment = RECIPES[recipe]
        runs_dir = runs / recipe.removesuffix(".sh")
        env = {**os.environ, "DATA_DIR": str(ROOT / "data" / "demo"), "RUN_NAME": "test_recipe",
               "OMP_NUM_THREADS": "1", "RUNS_DIR": str(runs_dir), "TEACHER": str(teacher), **environment}
        # The last --pretrained wins: every stage, adapter and head of the recipe runs, on a model that costs
        # nothing.
        tiny = ["--pretrained", str(tiny_checkpoint)]
        result = subprocess.run(["bash", str(ROOT / "scripts" / recipe), *SHORT, *tiny, *flags], env=env,
                                capture_output=True, text=True, timeout=600)
        return result, runs_dir
    chosen = [recipe for recipe in RECIPES if nli or not needs_nli(recipe)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(chosen, pool.map(run, chosen)))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_cpu_recipe_runs_on_the_demo_data(recipe, recipe_runs):
    if recipe not in recipe_runs:
        pytest.skip("the SimCSE recipes read ../shared/data/nli")
    result, runs_dir = recipe_runs[recipe]
    assert result.returncode == 0, result.stderr[-2000:]
    written = list(runs_dir.glob("test_recipe*/predictions/*-out.*"))
    tasks = RECIPES[recipe][1].get("TASKS", "").split()
    expected = OUTPUTS.get(recipe, 6) * (1 if "single" not in recipe else len(tasks))
    assert len(written) == expected


def launches(recipe: str, cwd: Path = ROOT, *flags: str, **environment: str) -> list[tuple[Path, list[str]]]:
    """The command lines a recipe started in `cwd` would launch, with the folder each would run in, printed by
    tests/print_command.sh as LAUNCH instead (nothing runs, no GPU needed)."""
    env = {k: v for k, v in os.environ.items() if k != "RUNS_DIR"}  # the recipes' default unless given here
    env.update({"LAUNCH": f"bash {ROOT / 'tests' / 'print_command.sh'}", "DATA_DIR": str(ROOT / "data" / "demo"),
                "RUN_NAME": "unused", "NLI_FILES": "nli.jsonl", "TEACHER": "teacher",  # gpu_sss.sh's, distill's
                "TASK": "sst", **environment})  # cpu_best_one_task.sh's
    result = subprocess.run(["bash", str(ROOT / "scripts" / recipe), *flags], env=env, capture_output=True,
                            text=True, timeout=60, cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [shlex.split(line) for line in result.stdout.splitlines() if line.strip()]
    assert lines and all(command[1] == str(ROOT / "multitask_classifier.py") for command in lines)
    return [(Path(folder), [Path(program).name, *rest]) for folder, program, *rest in lines]


def launched_commands(recipe: str, **environment: str) -> list[list[str]]:
    """The command lines a recipe started in the repository would launch (launches), the program named as
    multitask_classifier.py."""
    return [command for _, command in launches(recipe, **environment)]


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_a_recipe_shows_its_progress_bars_unless_asked_for_quiet(recipe):
    """A real-data stage is minutes of training: the recipes leave tqdm's bar (examples/s, time left) on; --quiet
    given to a recipe still reaches the run."""
    assert all("--quiet" not in command for command in launched_commands(recipe))
    assert all("--quiet" in command for _, command in launches(recipe, ROOT, "--quiet"))


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_every_output_of_a_recipe_goes_under_runs_dir(recipe, tmp_path):
    """RUNS_DIR moves the run folder and its predictions (the tests' runs write into a temporary folder);
    without it they stay under runs/, as before the variable existed."""
    drive = tmp_path / "My Drive" / "runs"  # Google Drive's folder: a space in every path under it
    for runs_dir, environment in ((ROOT / "runs", {}), (tmp_path, {"RUNS_DIR": str(tmp_path)}),
                                  (drive, {"RUNS_DIR": str(drive), "RUN_NAME": "my run"})):
        for command in launched_commands(recipe, **environment):
            paths = {flag: value for flag, value in zip(command, command[1:])
                     if flag == "--output_dir" or flag.startswith("--") and flag.endswith("_out")}
            assert "--output_dir" in paths and any(flag.endswith("_out") for flag in paths)
            run_folder = Path(paths.pop("--output_dir"))
            assert run_folder.parent == runs_dir  # one argument each, however many spaces
            assert run_folder.name.startswith(environment.get("RUN_NAME", "unused"))
            assert all(Path(path).parent == run_folder / "predictions" for path in paths.values()), paths


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_a_recipe_runs_where_it_was_started_so_relative_paths_mean_what_the_user_typed(recipe, tmp_path):
    """The recipes once changed to the repository first: --distill teacher or RUNS_DIR=runs typed in the user's
    folder named the repository's instead. Now each runs where it was started, naming the repository's files by
    their full path."""
    for folder, command in launches(recipe, tmp_path, "--distill", "my teacher", RUNS_DIR="my runs"):
        assert folder == tmp_path
        assert ("--distill", "my teacher") in zip(command, command[1:])
        assert Path(command[command.index("--output_dir") + 1]).parent == Path("my runs")


@pytest.mark.parametrize("recipe", sorted(name for name in TRAINING_RECIPES if name.startswith("gpu_")))
def test_gpu_recipe_is_a_valid_command_line(recipe):
    """No GPU here: the recipe runs with LAUNCH=echo, and every command it would launch must parse into
    valid training arguments with a buildable schedule and adapter configuration."""
    for command in launched_commands(recipe):
        args = from_namespace(TrainingArguments, build_parser(TrainingArguments).parse_args(command[1:]))
        assert args.use_gpu and args.pretrained == "bert-base-uncased"
        build_schedule(args.schedule, args.first_stages, args.cycle, args.cycles, args.epochs,
                       args.simcse_epochs if args.simcse_data else 0, args.mlm_epochs, run_tasks(args))
        adapter_config(args)


def parsed(command: list[str]) -> TrainingArguments:
    """The command line as multitask_classifier.py reads it: a flag that would do nothing ends it (SystemExit)."""
    return parse_training_args(command[1:], None)


DEFENCES = ("none", "rehearsal", "bregman", "thesis_smart", "simcse", "lnsr", "ewc", "l2sp", "lora",
            "thesis_smart_fp32", "bregman_epoch", "rs_only", "rs_eps0", "thesis_setting")


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_a_recipe_names_no_flag_that_would_do_nothing(recipe):
    """A feature's flag without its switch is refused (check_switched_flags); a recipe's own flags never are, nor
    are its SMART flags turned off by --no-smart after them (table 4.11's control)."""
    variants = [{"DEFENCE": defence} for defence in DEFENCES] if recipe == "cpu_forgetting_study.sh" else [{}]
    for environment in variants:
        for command in launched_commands(recipe, **environment):
            parsed(command)
            parsed([*command, "--no-smart"])


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "scripts").glob("[cg]pu_thesis_*.sh")))
def test_a_thesis_recipe_sets_the_thesis_settings_and_cites_its_tables(recipe):
    """The thesis' recipes run its settings (issue 46): float32, lr 1e-5, listing A.6's STS head; SMART as its listings
    compute it wherever it has SMART; its SimCSE loss and pairing wherever it has SimCSE; the GPU ones at its
    tokenizer's 512 tokens (the CPU twins at the CPU protocol's 64)."""
    (command,) = launched_commands(recipe)
    args = parsed(command)
    assert (args.precision, args.lr, args.similarity_objective, args.sts_cosine_dropout) == \
        ("fp32", 1e-5, "shifted", True)
    assert args.max_length == (512 if recipe.startswith("gpu_") else 64)
    assert args.smart == ("sbert" not in recipe) and args.batch_size == (32 if "sbert" in recipe else 8)
    for config in smart_configs(args).values() if args.smart else ():
        assert (config.reduction, config.anchor_mode, config.projection, config.norm_level) == \
            ("max", "train", "rescale", "sentence")
        assert (args.smart_momentum_schedule, args.smart_anchor) == ("stage", "stage_start")
    assert bool(args.simcse_data) == ("sss" in recipe)
    if args.simcse_data:
        assert (args.simcse_objective, args.simcse_pairing, args.simcse_lr) == ("pairwise", "product", 1e-5)
    assert re.search(r"tables? 4\.\d+", (ROOT / "scripts" / recipe).read_text())


@pytest.mark.parametrize("recipe", ["cpu_ss.sh", "cpu_sss.sh", "gpu_ss.sh", "gpu_sss.sh"])
def test_the_projects_own_smart_recipes_keep_their_measured_defaults(recipe):
    (command,) = launched_commands(recipe)
    args = parsed(command)
    assert all((config.reduction, config.anchor_mode, config.projection) == ("sum", "eval", "clamp")
               for config in smart_configs(args).values())
    assert (args.simcse_objective, args.simcse_pairing) == ("supervised", "zip")
    assert args.max_length == (128 if recipe.startswith("gpu_") else 64)


def test_no_smart_after_a_thesis_recipe_is_its_sbert_only_control():
    """Table 4.11: table 4.10's recipe without SMART, every other setting kept."""
    ((_, with_smart),), ((_, without),) = launches("gpu_thesis_ss_cycles.sh"), launches("gpu_thesis_ss_cycles.sh", ROOT,
                                                                                        "--no-smart")
    assert parsed(with_smart).smart and not parsed(without).smart
    assert {k: v for k, v in vars(parsed(without)).items() if k != "smart"} == \
        {k: v for k, v in vars(parsed(with_smart)).items() if k != "smart"}


@pytest.mark.slow
def test_the_ensemble_recipe_combines_the_committed_scores(tmp_path):
    protocol = ROOT.parent / "shared" / "data" / "protocol"
    if not protocol.is_dir():
        pytest.skip("the committed runs answered ../shared/data/protocol")
    env = {**os.environ, "DATA_DIR": str(protocol), "OUTPUT_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_ensemble.sh")], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "held out (chosen on half of dev" in result.stdout
    assert len(list(tmp_path.glob("*-out.csv"))) == 6


def robustness_study(tmp_path, runs: list[str], flags: tuple[str, ...] = (),
                     **environment: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """cpu_robustness_study.sh `flags` with `python` standing in for the scripts (it records its arguments in
    calls.txt and writes the suite's robustness.json), over a RUNS_DIR holding `runs`' folders: the result, RUNS_DIR,
    calls.txt."""
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text("#!/usr/bin/env bash\nprintf '%s\\n' \"$*\" >> \"$CALLS\"\n"
                    "for ((i = 1; i <= $#; i++)); do if [[ ${!i} == --output_dir ]]; then j=$((i + 1)); "
                    "mkdir -p \"${!j}\" && touch \"${!j}/robustness.json\"; fi; done\n")
    stub.chmod(0o755)
    runs_dir, calls = tmp_path / "runs", tmp_path / "calls.txt"
    for run in runs:
        (runs_dir / run).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "CALLS": str(calls), "RUNS_DIR": str(runs_dir),
           "DATA_DIR": "protocol", **environment}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_robustness_study.sh"), *flags], env=env,
                            capture_output=True, text=True)
    return result, runs_dir, calls


def five_seeds(name: str) -> list[str]:
    return [name] + [f"{name}_seed{seed}" for seed in range(1, 5)]


def test_the_robustness_study_scores_every_run_on_one_set_of_inputs_once_then_compares_the_arms(tmp_path):
    """Fifteen runs and the ensemble of three undefended ones, all with the same --perturbed_dir (made by the thesis'
    SMART's first run, as the committed study was), then the four arms compared, SMART's STS drop at eps 0.01 the
    primary comparison; the embedding attack alone at SMART's training radii apart, compared apart with no primary;
    a second call scores nothing again."""
    runs = five_seeds("none") + five_seeds("thesis_smart") + five_seeds("lnsr")
    for _ in range(2):
        result, runs_dir, calls = robustness_study(tmp_path, runs)
        assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines()
    suites = [line.split() for line in lines if line.split()[0].endswith("/scripts/robustness.py")]
    assert len(suites) == 32 and len(lines) == 36  # a second call only compares again
    study = runs_dir / "robustness_study"
    assert all(words[words.index("--perturbed_dir") + 1] == str(study / "perturbed") for words in suites)
    assert suites[0][1] == str(runs_dir / "thesis_smart")
    radii = [words[words.index("--epsilons") + 1:words.index("--epsilons") + 4] for words in suites]
    assert radii == [["1e-2", "3e-2", "1e-1"]] * 16 + [["1e-5", "1e-4", "1e-3"]] * 16
    assert all(("--families" in words) == (i >= 16) for i, words in enumerate(suites))
    assert all(Path(words[words.index("--output_dir") + 1]).parent == (study / "small_radii" if i >= 16 else study)
               for i, words in enumerate(suites))
    ensemble = suites[15]
    assert ensemble[1:4] == [str(runs_dir / f"none_seed{seed}") for seed in (2, 3, 4)]
    assert ensemble[ensemble.index("--output_dir") + 1] == str(study / "ensemble")
    compare, compare_small = (line.split() for line in lines[-2:])
    assert compare[0].endswith("compare_robustness.py") and compare[1] == "none=" + ",".join(
        str(study / name) for name in five_seeds("none"))
    assert [arm.split("=")[0] for arm in compare[1:5]] == ["none", "smart", "lnsr", "ensemble"]
    assert compare[-1] == str(study / "comparison.md") and compare_small[-1] == str(study / "comparison_small_radii.md")
    assert compare[5:7] == ["--primary", "smart:sts/embedding/eps=0.01"] and "--primary" not in compare_small
    assert compare_small[1] == "none=" + ",".join(str(study / "small_radii" / name) for name in five_seeds("none"))


def test_the_robustness_studys_small_radii_take_the_extra_flags_the_embedding_attack_reads(tmp_path):
    """Extra flags go to every suite, but those of the families the small radii do not run, which robustness.py
    refuses there as doing nothing (it stopped the study after the main suite)."""
    flags = ("--budget", "20", "--quiet", "--neighbours=3", "--attack_examples", "50", "--regression_margin", "0.5")
    result, _, calls = robustness_study(tmp_path, five_seeds("none") + five_seeds("thesis_smart"),
                                        flags, ARMS="none smart")
    assert result.returncode == 0, result.stderr
    suites = [line.split() for line in calls.read_text().splitlines() if "/scripts/robustness.py" in line.split()[0]]
    assert len(suites) == 20
    extra = [words[words.index("--epsilons") + 4:words.index("--output_dir")] for words in suites]
    assert extra == [list(flags)] * 10 + [["--quiet", "--attack_examples", "50"]] * 10


def test_the_robustness_study_scores_the_ablation_arms_at_the_seeds_asked_and_refuses_a_missing_run(tmp_path):
    """ARMS and SEEDS pick the forgetting study's ablation runs (issue 57); a run not in RUNS_DIR stops the study in one
    line before anything is scored."""
    environment = {"ARMS": "none rs_eps0 thesis_smart_fp32", "SEEDS": "11711 2"}
    result, runs_dir, calls = robustness_study(tmp_path, ["none", "none_seed2", "rs_eps0", "rs_eps0_seed2",
                                                          "thesis_smart_fp32"], **environment)
    assert result.returncode == 2 and not calls.exists()
    assert result.stderr.strip().splitlines() == [f"cpu_robustness_study.sh: {runs_dir}/thesis_smart_fp32_seed2: no "
                                                  "such run (arm thesis_smart_fp32; SEEDS picks the seeds)"]
    (runs_dir / "thesis_smart_fp32_seed2").mkdir()
    result, _, calls = robustness_study(tmp_path, [], **environment)
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in calls.read_text().splitlines()]
    scored = [words[1] for words in lines if words[0].endswith("/scripts/robustness.py")]
    assert scored[:6] == [str(runs_dir / run) for run in ("none", "none_seed2", "thesis_smart_fp32",
                                                          "thesis_smart_fp32_seed2", "rs_eps0", "rs_eps0_seed2")]
    assert len(scored) == 12
    study = runs_dir / "robustness_study"
    assert lines[6][1:4] == [f"{arm}=" + ",".join(str(study / run) for run in (arm, f"{arm}_seed2"))
                             for arm in ("none", "rs_eps0", "thesis_smart_fp32")]
    assert all("--primary" not in words for words in lines)  # smart is not an arm: no default primary
    result, _, _ = robustness_study(tmp_path, [], ARMS="none dropout")
    assert result.returncode == 2 and "ARMS: unknown arm 'dropout'" in result.stderr


def comparisons(calls: Path) -> list[list[str]]:
    """The compare_robustness.py calls recorded in calls.txt, each as its words."""
    return [line.split() for line in calls.read_text().splitlines() if "compare_robustness.py" in line.split()[0]]


def test_the_robustness_study_passes_a_declared_primary_and_refuses_one_whose_arm_is_not_compared(tmp_path):
    """PRIMARY declares the main comparison's primary (the ablation's: rs_only against rs_eps0, issue 57), the
    small-radii comparison gets none unless PRIMARY_SMALL_RADII names one; a primary naming the baseline or an arm not
    compared stops the study in one line before anything is scored."""
    runs = ["rs_eps0", "rs_only"]
    result, runs_dir, calls = robustness_study(tmp_path, runs, ARMS="rs_eps0 rs_only", SEEDS="11711",
                                               PRIMARY="rs_only:sts/embedding/eps=0.01")
    assert result.returncode == 0, result.stderr
    compare, compare_small = comparisons(calls)
    assert compare[3:5] == ["--primary", "rs_only:sts/embedding/eps=0.01"] and "--primary" not in compare_small
    calls.unlink()
    result, _, calls = robustness_study(tmp_path, [], ARMS="rs_eps0 rs_only", SEEDS="11711",
                                        PRIMARY_SMALL_RADII="sts/embedding/eps=1e-05")
    compare, compare_small = comparisons(calls)
    assert "--primary" not in compare and compare_small[3:5] == ["--primary", "sts/embedding/eps=1e-05"]
    calls.unlink()
    result, _, calls = robustness_study(tmp_path, [], ARMS="rs_eps0 rs_only", SEEDS="11711", COMPARISON="ablation")
    compare, compare_small = comparisons(calls)  # a call of other arms names its own files, the first call's stay
    study = runs_dir / "robustness_study"
    assert (compare[-1], compare_small[-1]) == (str(study / "ablation.md"), str(study / "ablation_small_radii.md"))
    for name in ("PRIMARY", "PRIMARY_SMALL_RADII"):
        (tmp_path / name).mkdir()
        result, _, _ = robustness_study(tmp_path / name, runs, ARMS="rs_eps0 rs_only", SEEDS="11711",
                                        **{name: "rs_eps0:sts/embedding/eps=0.01"})
        assert result.returncode == 2 and not (tmp_path / name / "calls.txt").exists()
        assert result.stderr.strip() == (f"cpu_robustness_study.sh: {name}: 'rs_eps0' is not one of the later arms "
                                         "(rs_only)")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_check_refuses_a_machine_without_cuda_in_one_line():
    result = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout.strip() == "gpu_check: no CUDA device visible to torch"


def test_gpu_check_lists_its_checks_and_refuses_an_unknown_one_in_one_line():
    listed = subprocess.run(["bash", "scripts/gpu_check.sh", "--list"], cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0 and {"gpu_tests", "qqp_epoch", "gpu_best"} <= set(listed.stdout.split())
    result = subprocess.run(["bash", "scripts/gpu_check.sh", "gpu_tests", "nope"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 2
    assert result.stdout.strip() == "gpu_check: unknown check 'nope' (bash scripts/gpu_check.sh --list names them)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="stands a CUDA check in for this CPU-only machine")
def test_gpu_check_runs_named_checks_and_tables_them_with_the_ones_recorded_before(tmp_path):
    """Named checks replace their own rows and keep the others': a failed check rerun after a fix, or the checks
    split over two sessions of a lent GPU. `python -c` (the CUDA probe) is answered yes by a stand-in python."""
    shim = tmp_path / "bin" / "python"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\n[ "$1" = -c ] && case "$2" in *cuda.is_available*) exit 0;; esac\n'
                    f'exec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    rows = tmp_path / "runs" / "gpu_check" / "rows"
    rows.mkdir(parents=True)
    (rows / "gpu_best").write_text("| gpu_best | FAIL (1) | 3 s | earlier |\n")
    (rows / "optimizer_test").write_text("| optimizer_test | FAIL (1) | 1 s | before the fix |\n")
    env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "RUNS_DIR": str(tmp_path / "runs")}
    result = subprocess.run(["bash", "scripts/gpu_check.sh", "optimizer_test"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    table = [line for line in result.stdout.splitlines() if line.startswith("| ") and " s | " in line]
    assert table[0].startswith("| optimizer_test | pass |") and table[0].endswith("| Optimizer test passed! |")
    assert table[1:] == ["| gpu_best | FAIL (1) | 3 s | earlier |"]
    assert result.returncode == 1  # the earlier failure still stands until gpu_best is rerun

SMART_ABLATION = ("thesis_smart_fp32", "bregman_epoch", "rs_only", "rs_eps0")


def smart_settings(args: TrainingArguments) -> dict[str, tuple]:
    """Each task's (lambda_s, mu, epsilon, precision) as the run's SMART configurations resolve them."""
    return {task: (config.adv_weight, config.bregman_weight, config.epsilon, config.precision)
            for task, config in smart_configs(args).items()}


def test_the_smart_ablation_arms_switch_one_part_of_the_thesis_smart_off_in_exact_float32():
    """Issue 57: the thesis' SMART with its passes in exact float32, its D_Breg alone (anchored to each epoch's start),
    its R_s alone, and its R_s at eps 0 (two dropout forwards); everything else as thesis_smart sets it."""
    args = {defence: parsed(launched_commands("cpu_forgetting_study.sh", DEFENCE=defence)[0])
            for defence in ("thesis_smart", *SMART_ABLATION)}
    thesis = {"sst": (10.0, 1.0, 1e-5), "qqp": (5.0, 1.0, 1e-5), "sts": (5.0, 1.0, 1e-5)}
    expected = {"thesis_smart_fp32": thesis,
                "bregman_epoch": {task: (0.0, 1.0, 1e-5) for task in thesis},
                "rs_only": {task: (adv, 0.0, 1e-5) for task, (adv, _, _) in thesis.items()},
                "rs_eps0": {task: (adv, 0.0, 0.0) for task, (adv, _, _) in thesis.items()}}
    assert smart_settings(args["thesis_smart"]) == {task: (*values, "run") for task, values in thesis.items()}
    for defence, settings in expected.items():
        assert smart_settings(args[defence]) == {task: (*values, "exact") for task, values in settings.items()}
        assert (args[defence].smart_anchor, args[defence].smart_momentum_schedule, args[defence].smart_anchor_mode) \
            == ("stage_start", "stage", "train")
        assert (args[defence].batch_size, args[defence].precision) == (32, "auto")  # the study's protocol
    for defence in ("thesis_smart_fp32", "rs_only", "rs_eps0"):
        assert all((config.reduction, config.projection, config.norm_level) == ("max", "rescale", "sentence")
                   for config in smart_configs(args[defence]).values())


def test_the_thesis_setting_arm_runs_the_thesis_own_settings_on_the_study_schedule():
    none, thesis = (parsed(launched_commands("cpu_forgetting_study.sh", DEFENCE=defence)[0])
                    for defence in ("none", "thesis_setting"))
    assert (thesis.batch_size, thesis.hidden_dropout_prob, thesis.precision, thesis.lr) == (8, 0.3, "fp32", 1e-5)
    assert (thesis.similarity_objective, thesis.sts_cosine_dropout) == ("shifted", True)
    assert smart_settings(thesis) == {"sst": (10.0, 1.0, 1e-5, "run"), "qqp": (5.0, 1.0, 1e-5, "run"),
                                      "sts": (5.0, 1.0, 1e-5, "run")}
    assert (thesis.first_stages, thesis.stage_start, thesis.pretrained, thesis.max_length) == \
        (none.first_stages, none.stage_start, none.pretrained, none.max_length)


def test_every_arm_of_the_forgetting_study_records_where_it_departs_from_the_thesis():
    """--departures (kept in args.json): the scaled protocol everywhere, the study's own batch, lr, dropout, STS head
    and precision except in thesis_setting, and each arm's own departure."""
    departures = {defence: parsed(launched_commands("cpu_forgetting_study.sh", DEFENCE=defence)[0]).departures
                  for defence in DEFENCES}
    assert all("minilm-l6 at 64 tokens" in text and "epochs 1 / 2 / 2" in text for text in departures.values())
    assert all(("batch 32 (8)" in text) == (defence != "thesis_setting") for defence, text in departures.items())
    assert all("exact float32" in departures[defence] for defence in SMART_ABLATION)
    assert "eps 0" in departures["rs_eps0"] and "mu 0" in departures["rs_only"]
    assert "lambda_s 0" in departures["bregman_epoch"] and "no SMART" in departures["none"]
    assert len(set(departures.values())) == len(DEFENCES)


def test_the_forgetting_study_runs_each_defence_and_refuses_an_unknown_one():
    flags = {defence: launched_commands("cpu_forgetting_study.sh", DEFENCE=defence)[0] for defence in DEFENCES}
    assert "--ewc_weight" in flags["ewc"] and "--l2sp_weight" in flags["l2sp"] and "--adapter" in flags["lora"]
    assert "--smart_bregman_weight" in flags["bregman"] and "qqp,sts*2,sst*2,qqp:0.03" in flags["rehearsal"]
    thesis = " ".join(flags["thesis_smart"])  # R_s on, as the listings reduce it, D_Breg anchored to each epoch's start
    assert all(setting in thesis for setting in ("--smart_adv_weight 5", "--smart_reduction max",
                                                 "--smart_anchor stage_start", "--smart_anchor_mode train"))
    assert "--simcse_data" in flags["simcse"] and "--simcse_objective" in flags["simcse"]
    assert "--lnsr" in flags["lnsr"] and "sst,qqp,sts" in flags["lnsr"]
    assert not {"--smart", "--simcse_data"} & set(flags["none"])
    assert not {"--ewc_weight", "--l2sp_weight", "--adapter", "--smart"} & set(flags["none"])
    result = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_forgetting_study.sh")],
                            env={**os.environ, "LAUNCH": "echo", "DEFENCE": "dropout"}, capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "DEFENCE" in result.stderr
