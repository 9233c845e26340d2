"""The flags --resume accepts changed (training_args' resume_free fields): each one proven to leave the result, byte
for byte, as the run never stopped gives it; the flags that would change it refused in one line naming them. A run
stops after its first stage (--stop_after_stages) and resumes with the flag changed; the reference never stopped."""
import json
import shutil

import pytest

import multitask_classifier as mc
from conftest import DEMO, exit_code, prediction_flags, skip_figures
from minbert.run.training_args import TrainingArguments, resume_free_fields

pytestmark = pytest.mark.usefixtures("one_thread", "no_plots")

CSVS = [f"{task}-{split}-out.csv" for task in ("sst", "para", "sts") for split in ("dev", "test")]
# qqp, sts, sst@0.5, with SMART (its anchor and momentum are part of what a resume must restore).
STAGES = ("--smart", "--first_stages", "qqp", "--cycle", "sts,sst:0.5", "--cycles", "1")


def run_flags(checkpoint, out, *extra, data_dir=DEMO) -> list[str]:
    """A tiny run in out/run, its CSVs in out/ (not --quiet: the progress bars are among what may change)."""
    return ["--data_dir", str(data_dir), "--pretrained", str(checkpoint), "--option", "finetune",
            "--max_train_examples", "24", "--max_length", "32", "--batch_size", "8", "--lr", "1e-3",
            "--precision", "fp32", "--output_dir", str(out / "run"), *prediction_flags(out), *extra]


def metrics(run) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in ("seconds", "eval_seconds")}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def outputs(out, with_last: bool = False) -> dict:
    """The result: the kept model's weights and dev metrics, the dev and test scores, the six CSVs, metrics.jsonl
    (without times) and, `with_last`, the training state at the end (last.safetensors)."""
    run = out / "run"
    files = {name: (run / name).read_bytes() for name in ("best.safetensors",) + (("last.safetensors",) * with_last)}
    files |= {f"scores/{path.name}": path.read_bytes() for path in sorted((run / "scores").glob("*-[dt]e*.csv"))}
    files |= {name: (out / name).read_bytes() for name in CSVS}
    best = json.loads((run / "best.json").read_text())["metrics"]
    return files | {"best metrics": {k: v for k, v in best.items() if k not in ("seconds", "eval_seconds")}, "metrics": metrics(run)}


@pytest.fixture(scope="module")
def never_stopped(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("never_stopped")
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert mc.main(run_flags(tiny_checkpoint, out, *STAGES)) == 0
    return outputs(out)


def copied_data(tmp_path):
    """data/demo copied elsewhere: the data's content, not its path, is what a resume compares."""
    return shutil.copytree(DEMO, tmp_path / "elsewhere")


# Each resume-free flag, changed on the resume: the flags the resume adds (a function of the test's folder).
CHANGED = {
    "num_workers": lambda tmp: ["--num_workers", "1"],
    "quiet": lambda tmp: ["--quiet"],
    "logging_steps": lambda tmp: ["--logging_steps", "1"],
    "save_steps": lambda tmp: ["--save_steps", "1"],
    "save_every_minutes": lambda tmp: ["--save_every_minutes", "1e-8"],
    "gradient_checkpointing": lambda tmp: ["--gradient_checkpointing"],
    "keep_stage_models": lambda tmp: ["--keep_stage_models"],
    "score_train": lambda tmp: ["--score_train"],
    "report_to": lambda tmp: ["--report_to", "tensorboard"],
    "bf16": lambda tmp: ["--no-bf16"],  # --precision fp32 spelled otherwise
    "data_dir": lambda tmp: ["--data_dir", str(copied_data(tmp))],
    "data_files": lambda tmp: ["--sst_train", str(copied_data(tmp) / "ids-sst-train.csv")],
    "departures": lambda tmp: ["--departures", "a note changed on the resume"],
    "save_total_limit": lambda tmp: ["--save_total_limit", "2"],
    "keep_resume_state": lambda tmp: ["--keep_resume_state"],
}
# Resume-free by what they are, proven elsewhere: the resume itself; its output folder moved or respelled
# (test_multitask_classifier.py); the CSVs' paths (only where the same bytes go: outputs() reads them where the
# resume wrote them); --demo (its settings are defaults: the resolved settings are compared); SimCSE's NLI files
# (their triplets' content is among the data's fingerprints); --cycles (below, and test_multitask_classifier.py);
# --resume_from, a resume from a chosen checkpoint (test_run_folder.py).
FREE_BY_DEFINITION = {"resume", "resume_from", "stop_after_stages", "output_dir", "prediction_files", "demo",
                      "simcse_data", "cycles"}


def test_every_resume_free_flag_is_proven_here():
    assert resume_free_fields(TrainingArguments) == CHANGED.keys() | FREE_BY_DEFINITION


@pytest.mark.parametrize("flag", sorted(CHANGED))
def test_a_resume_with_a_free_flag_changed_ends_as_the_run_never_stopped(never_stopped, tiny_checkpoint, tmp_path,
                                                                          flag):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *STAGES, "--stop_after_stages", "1")) == 0
    changed = CHANGED[flag](tmp_path)
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *STAGES, "--resume", *changed)) == 0
    assert outputs(tmp_path) == never_stopped


@pytest.mark.parametrize("flag, value", [("eval_batch_size", "7"), ("precision", "bf16"),
                                         ("compile_mode", ["max-autotune", "--compile"])])
def test_a_resume_refuses_a_flag_that_changes_the_result_in_one_line(tiny_checkpoint, tmp_path, capsys, flag, value):
    """--eval_batch_size changes how dev batches pad, and so the dev scores and the model kept; --precision and
    --use_gpu the numbers computed; --compile_mode the kernels compiled (with --compile, which it tunes)."""
    value = value if isinstance(value, list) else [value]
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *STAGES, "--quiet", "--stop_after_stages", "1")) == 0
    before = (tmp_path / "run" / "last.json").read_bytes()
    capsys.readouterr()
    assert exit_code(run_flags(tiny_checkpoint, tmp_path, *STAGES, "--quiet", "--resume", f"--{flag}", *value)) == 2
    lines = [line for line in capsys.readouterr().err.strip().splitlines()
             if not line.startswith("warning: --compile on a CPU")]  # --compile's own warning, before the refusal
    assert len(lines) == 1 and lines[0].startswith("error: cannot resume") and f"--{flag} " in lines[0]
    assert (tmp_path / "run" / "last.json").read_bytes() == before


@pytest.mark.parametrize("flag", ["eval_batch_size", "use_gpu", "precision", "compile_mode", "capture_step"])
def test_flags_that_change_the_result_are_not_resume_free(flag):
    assert flag not in resume_free_fields(TrainingArguments)


# ---------------------------------------------------------------------------------------------------
# --cycles: a finished run extended by more cycles continues as the longer run never stopped


EXTENDED = {  # what follows the shorter run's last stage, which a run's end skips: flags, the shorter run's --cycles
    # the sts*2 block ends the shorter run: the next cycle starts from its best epoch, EWC consolidates on it
    "stage_start best, EWC": (["--cycle", "sst:0.5,sts*2", "--stage_start", "best", "--ewc_weight", "50",
                               "--ewc_fisher_batches", "2"], 1),
    # STS epochs are one multi-epoch stage across the cycles: early stopping decides after the shorter run's last
    # (at this rate, the longer run stops after stage 3)...
    "patience": (["--cycle", "sts", "--patience", "1", "--lr", "3e-3"], 2),
    # ...and when it stopped the shorter run early, its skip reaches the longer run's end, not the shorter's
    "patience, skipped to the end": (["--cycle", "sts", "--patience", "1", "--lr", "3e-3"], 3),
    # SMART's anchor becomes the weights each stage starts from, the first stage of the new cycles too
    "SMART stage_start anchor": (["--smart", "--smart_anchor", "stage_start", "--cycle", "sts,sst:0.5"], 1),
}


@pytest.mark.parametrize("case", sorted(EXTENDED))
def test_more_cycles_extend_a_finished_run_as_the_longer_run_never_stopped(tiny_checkpoint, tmp_path, case):
    flags, shorter = EXTENDED[case]
    flags = ["--quiet", "--keep_resume_state", "--first_stages", "qqp", *flags]  # the shorter run's state continues
    longer, extended = tmp_path / "longer", tmp_path / "extended"
    assert mc.main(run_flags(tiny_checkpoint, longer, *flags, "--cycles", "4")) == 0
    assert mc.main(run_flags(tiny_checkpoint, extended, *flags, "--cycles", str(shorter))) == 0
    assert mc.main(run_flags(tiny_checkpoint, extended, *flags, "--cycles", "4", "--resume")) == 0
    assert outputs(extended, with_last=True) == outputs(longer, with_last=True)


def test_more_cycles_need_the_best_stage_of_the_block_that_ended_the_run(tiny_checkpoint, tmp_path, capsys):
    """A finished run's checkpoint saved before the block's best was kept at a run's end (block_best null) cannot go
    on from that block's best: refused in one line, not continued from its last stage."""
    flags = ["--quiet", "--keep_resume_state", "--first_stages", "qqp", *EXTENDED["stage_start best, EWC"][0]]
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *flags, "--cycles", "1")) == 0
    info = tmp_path / "run" / "last.json"
    assert json.loads(info.read_text())["block_best"] is not None
    info.write_text(json.dumps({**json.loads(info.read_text()), "block_best": None}))
    capsys.readouterr()
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, *flags, "--cycles", "4", "--resume")) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: cannot resume with more stages: the checkpoint lacks the best stage of the block that "
                     "ended the run (sts); resume with the run's own --cycles"]
