"""Data parallel training (distributed.py): sharded epochs, and two gloo processes on the CPU giving what
one process gives on the concatenated batch — one optimizer step with and without SMART, the gathered
SimCSE loss, and whole torchrun runs (with --resume). Deselect with -m "not distributed"."""
import dataclasses
import datetime
import json
import os
import random
import shutil
import socket
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from conftest import DEMO, MAX_LENGTH, ROOT, demo_examples, deterministic_tiny_model, prediction_flags
from runs_in_one_launch import launch
from minbert.data.batches import LengthBucketSampler, collate_pairs, collate_sentences
from minbert.data.nli import NLITriplet
from minbert.distributed import (SINGLE_PROCESS, Distributed, cut_global_batches, data_parallel, global_batch_count,
                                leaving_together)
from minbert.tasks import MULTITASK
from minbert.training.distillation import Distillation, TeacherScores
from minbert.training.gradient_surgery import GradientSurgery
from minbert.training.mlm import mlm_batches
from simcse import supervised_simcse_loss, triplet_batches

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------
# Sharding (no processes needed: every rank computes the same global batches and keeps its slice)


@pytest.mark.parametrize("num_examples", [1, 7, 8, 9, 17, 803])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_example_is_seen_once_per_epoch_across_ranks(num_examples, world_size):
    if num_examples < world_size:
        with pytest.raises(ValueError, match="cannot be shared"):
            cut_global_batches(list(range(num_examples)), 4, world_size)
        return
    lengths = [(7 * i) % 23 for i in range(num_examples)]
    shards = [list(LengthBucketSampler(lengths, 4, True, seed=3, bucket_size_multiplier=2,
                                       world_size=world_size, rank=rank)) for rank in range(world_size)]
    steps = {len(batches) for batches in shards}
    assert steps == {global_batch_count(num_examples, 4, world_size)}  # every rank takes the same number of steps
    assert all(batch for batches in shards for batch in batches)  # no rank ever gets an empty batch
    seen = sorted(i for batches in shards for batch in batches for i in batch)
    assert seen == list(range(num_examples))


def test_one_process_batches_are_the_plain_ones():
    lengths = [(5 * i) % 17 for i in range(101)]
    plain = list(LengthBucketSampler(lengths, 8, True, seed=1))
    assert plain == list(LengthBucketSampler(lengths, 8, True, seed=1, world_size=1, rank=0))
    assert len(plain) == 13 and sorted(len(b) for b in plain)[1:] == [8] * 12


def test_a_tail_smaller_than_the_ranks_joins_the_batch_before_it():
    assert cut_global_batches(list(range(9)), 2, 2) == [[0, 1, 2, 3], [4, 5, 6, 7, 8]]
    assert cut_global_batches(list(range(10)), 2, 2) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_simcse_and_mlm_batches_are_sharded(tokenizer):
    triplets = [NLITriplet(f"a {i}", f"p {i}", f"n {i}") for i in range(11)]
    full = [t for batch in triplet_batches(triplets, tokenizer, 6, 5, MAX_LENGTH) for t in _texts(batch, tokenizer)]
    shards = [[t for batch in triplet_batches(triplets, tokenizer, 3, 5, MAX_LENGTH, 2, rank)
               for t in _texts(batch, tokenizer)] for rank in range(2)]
    assert sorted(shards[0] + shards[1]) == sorted(full)
    sentences = [f"sentence number {i}" for i in range(11)]
    counts = [sum(len(b["input_ids"]) for b in mlm_batches(sentences, tokenizer, 3, 5, MAX_LENGTH, 2, rank))
              for rank in range(2)]
    assert counts == [6, 5]


def _texts(batch, tokenizer) -> list[str]:
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in batch["input_ids"]]


# ---------------------------------------------------------------------------------------------------
# Two gloo processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, world_size: int, port: int) -> Distributed:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    distributed, _ = Distributed.from_environment(use_gpu=False)
    return distributed


def _spawn(worker, folder: Path, world_size: int = 2) -> None:
    """Runs worker(rank, world_size, port, folder) in world_size spawned processes; a failed spawn names the
    results the ranks had written to folder, so that a rank's abort says how far it got."""
    try:
        mp.spawn(worker, args=(world_size, _free_port(), folder), nprocs=world_size, join=True)
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as err:
        written = sorted(f.name for f in folder.iterdir())
        raise AssertionError(f"{err}; results written before it: {written or 'none'}") from err


def _shape_noise(x, dtype=None, **kwargs):
    """SMART's random start as a function of the embedding itself: both sides draw the same for each example."""
    return torch.sin(1e3 * x).to(dtype or x.dtype)


def _batch(task: str, examples, tokenizer):
    if task == "sst":
        return collate_sentences(examples, tokenizer, MAX_LENGTH)
    return collate_pairs(examples, tokenizer, MAX_LENGTH)


def _one_step(trainer, task: str, batches: dict) -> dict[str, torch.Tensor]:
    """Train one optimizer step through run_steps, on batches[task]; for task "cagrad" / "pcgrad" on one
    batch of each task combined by that gradient surgery; for "accumulated" on an SST and an STS batch
    accumulated into one update; for "distilled" on an SST batch mixed with a teacher's scores. Returns the
    gradients the optimizer saw."""
    seen = {}
    step = trainer.optimizer.step

    def recording_step():
        seen.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        step()
    trainer.optimizer.step = recording_step
    if task in ("cagrad", "pcgrad"):
        trainer.parts.gradient_surgery = GradientSurgery(task)
        trainer.loop.run_steps([list(batches.items())], 1, "test", surgery_rng=random.Random(0))
    elif task == "distilled":  # each rank looks its own examples' teacher scores up by id
        examples = demo_examples("sst", "train", 7)
        logits = np.random.default_rng(0).normal(size=(len(examples), 5))
        # a penalty of the step's objective, built at the task's first step
        trainer.parts.penalties.append(Distillation({"sst": TeacherScores({e.id: i for i, e in enumerate(examples)},
                                                                          logits)}))
        trainer.loop.run_steps([[("sst", batches["sst"])]], 1, "test")
    elif task == "accumulated":
        trainer.loop.config = dataclasses.replace(trainer.config, grad_accumulation_steps=2)
        trainer.loop.run_steps([[(t, batches[t])] for t in ("sst", "sts")], 2, "test")
    else:
        trainer.loop.run_steps([[(task, batches[task])]], 1, "test")
    return seen


def _batches(task: str, tokenizer, rank: int = 0, world_size: int = 1) -> dict:
    """7 training examples per task (slices of 4 and 3 on two ranks: the weighting by share matters)."""
    tasks = {"cagrad": MULTITASK, "pcgrad": MULTITASK, "accumulated": ("sst", "sts"), "distilled": ("sst",)}.get(
        task, (task,))
    return {t: _batch(t, demo_examples(t, "train", 7)[rank::world_size], tokenizer) for t in tasks}


def _step_trainer(distributed, tmp_path, tokenizer, smart: bool):
    from minbert.data.batches import TaskData
    from minbert.run.run_setup import build_trainer
    from minbert.run.training_args import TrainingArguments

    # float32: the default (auto) is bf16 on a CPU with native bf16, and the steps are compared to float32 precision.
    args = TrainingArguments(option="finetune", batch_size=4, lr=1e-3, max_length=MAX_LENGTH, quiet=True,
                             precision="fp32", output_dir=str(tmp_path / "run"), smart=smart)
    data = {t: TaskData(demo_examples(t, "train", 8), demo_examples(t, "dev", 4), None) for t in MULTITASK}
    return build_trainer(args, deterministic_tiny_model(), tokenizer, data, [], torch.device("cpu"),
                         distributed=distributed)


STEP_CASES = [("sst", False), ("sts", False), ("sst", True), ("qqp", True), ("cagrad", False), ("pcgrad", False),
              ("accumulated", True), ("distilled", False)]


def _simcse_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {k: torch.randn(5, 16, generator=generator) for k in ("anchor", "positive", "negative")}


def _step_case(distributed, rank, world_size, task, smart, folder, tokenizer):
    trainer = _step_trainer(distributed, folder / f"step-{task}-{smart}", tokenizer, smart)  # its own output_dir
    gradients = _one_step(trainer, task, _batches(task, tokenizer, rank, world_size))
    weights = {n: p.detach().contiguous() for n, p in trainer.model.named_parameters()}
    save_file({**{f"grad.{n}": g for n, g in gradients.items()}, **{f"weight.{n}": w for n, w in weights.items()}},
              str(folder / f"step-{task}-{smart}.rank{rank}.safetensors"))


def _simcse_case(distributed, rank, folder):
    full = _simcse_inputs()
    sizes = [3, 2]
    start = sum(sizes[:rank])
    local = {k: v[start:start + sizes[rank]].clone().requires_grad_() for k, v in full.items()}
    gathered = [distributed.gather_with_grad(local[k]) for k in ("anchor", "positive", "negative")]
    loss = supervised_simcse_loss(*gathered, temperature=0.05)
    (loss * distributed.world_size).backward()  # as Trainer.simcse_step: the average over ranks divides it
    save_file({"loss": loss.detach().reshape(1), **{f"grad.{k}": v.grad for k, v in local.items()}},
              str(folder / f"simcse.rank{rank}.safetensors"))


def _gradient_case(distributed, rank, folder):
    both, only_rank0, neither = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    both.grad = torch.full((2,), float(rank + 1))
    if rank == 0:
        only_rank0.grad = torch.full((2,), 4.0)
    distributed.average_gradients([both, only_rank0, neither])
    save_file({"both": both.grad, "only_rank0": only_rank0.grad, "neither": torch.tensor([neither.grad is None])},
              str(folder / f"gradients.rank{rank}.safetensors"))


def _every_case_worker(rank, world_size, port, folder):
    """One rank of every two-process case below, one case after another in the same process group: a spawned
    rank costs 10 s or more before its first step (importing torch and the trainer) on two busy cores. Each case
    builds its own trainer, model and tensors, so the order changes nothing. A case that raises ends its rank,
    and mp.spawn the other (a rank that carried on would wait forever in a collective the other never reaches)."""
    from tokenizer import BertTokenizer
    distributed = _join(rank, world_size, port)
    torch.randn_like = _shape_noise
    tokenizer = BertTokenizer.from_pretrained("minilm-l6")
    cases = [(f"step {task}, smart={smart}", partial(_step_case, distributed, rank, world_size, task, smart, folder,
                                                     tokenizer)) for task, smart in STEP_CASES]
    cases += [("simcse", partial(_simcse_case, distributed, rank, folder)),
              ("gradient average", partial(_gradient_case, distributed, rank, folder))]
    with leaving_together(distributed):
        for name, case in cases:
            try:
                case()
            except Exception as err:
                raise RuntimeError(f"the two-process case '{name}' failed on rank {rank}") from err
    # Every result written and the group left: out without the interpreter's teardown, in which a rank of this
    # spawn aborted in CI (SIGABRT, after its cases; gloo's threads free the tensors they hold while the
    # interpreter finalises, pytorch/pytorch#179291), which is not what these tests are here to test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The folder of what both ranks of every two-process case saved (NAME.rank{0,1}.safetensors), from one spawn."""
    folder = tmp_path_factory.mktemp("two-ranks")
    _spawn(_every_case_worker, folder)
    return folder


def _ranks(folder, name: str) -> list[dict[str, torch.Tensor]]:
    return [load_file(str(folder / f"{name}.rank{rank}.safetensors")) for rank in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("task,smart", STEP_CASES)
def test_two_processes_take_the_step_of_one_on_the_whole_batch(two_ranks, tmp_path, tokenizer, monkeypatch, task,
                                                               smart):
    monkeypatch.setattr(torch, "randn_like", _shape_noise)
    trainer = _step_trainer(SINGLE_PROCESS, tmp_path, tokenizer, smart)
    expected = _one_step(trainer, task, _batches(task, tokenizer))
    ranks = _ranks(two_ranks, f"step-{task}-{smart}")
    assert ranks[0].keys() == ranks[1].keys() == {f"grad.{n}" for n in expected} | {
        f"weight.{n}" for n, _ in trainer.model.named_parameters()}
    for name, gradient in expected.items():
        for saved in ranks:
            torch.testing.assert_close(saved[f"grad.{name}"], gradient, rtol=1e-5, atol=1e-6)
    for name, weight in trainer.model.named_parameters():
        assert torch.equal(ranks[0][f"weight.{name}"], ranks[1][f"weight.{name}"]), name  # one model
        torch.testing.assert_close(ranks[0][f"weight.{name}"], weight.detach(), rtol=0, atol=1e-6)


@pytest.mark.distributed
def test_the_gathered_simcse_loss_is_the_loss_of_the_whole_batch(two_ranks):
    leaves = {k: v.clone().requires_grad_() for k, v in _simcse_inputs().items()}
    expected = supervised_simcse_loss(leaves["anchor"], leaves["positive"], leaves["negative"], 0.05)
    expected.backward()
    ranks = _ranks(two_ranks, "simcse")
    for saved in ranks:
        torch.testing.assert_close(saved["loss"][0], expected.detach())
    for k, leaf in leaves.items():
        # Each rank gets world_size x the whole batch's gradient of its own rows, which the average of
        # the parameters' gradients over ranks divides again.
        torch.testing.assert_close(torch.cat([ranks[0][f"grad.{k}"], ranks[1][f"grad.{k}"]]) / 2, leaf.grad)


@pytest.mark.distributed
def test_gradient_average_keeps_absent_gradients_absent(two_ranks):
    for saved in _ranks(two_ranks, "gradients"):
        assert saved["both"].tolist() == [1.5, 1.5]
        assert saved["only_rank0"].tolist() == [2.0, 2.0]  # a zero on the rank without it
        assert saved["neither"].item()  # the optimizer skips it, as in one process


def _recording_group(monkeypatch) -> list[str]:
    """data_parallel on a two-rank Distributed in a process group whose barrier and destruction record their calls
    (no processes)."""
    import minbert.distributed as distributed_module
    calls = []
    monkeypatch.setattr(Distributed, "from_environment",
                        classmethod(lambda cls, use_gpu: (Distributed(0, 0, 2), torch.device("cpu"))))
    monkeypatch.setattr(distributed_module.dist, "is_initialized", lambda: "destroy" not in calls)
    monkeypatch.setattr(distributed_module.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(distributed_module.dist, "destroy_process_group", lambda: calls.append("destroy"))
    return calls


def test_ranks_leave_the_group_together_after_a_run(monkeypatch):
    calls = _recording_group(monkeypatch)
    with data_parallel(use_gpu=False) as (distributed, _):
        assert distributed.enabled
    assert calls == ["barrier", "destroy"]  # no rank tears gloo down while another still uses it


@pytest.mark.parametrize("failure", [RuntimeError("a rank fails"), KeyboardInterrupt()])
def test_a_failed_rank_leaves_the_group_without_waiting_for_the_others(monkeypatch, failure):
    calls = _recording_group(monkeypatch)
    with pytest.raises(type(failure)), data_parallel(use_gpu=False):
        raise failure
    assert calls == ["destroy"]  # a barrier here would hang: the other ranks never reach it


# ---------------------------------------------------------------------------------------------------
# Whole runs under torchrun


@pytest.fixture(scope="module")
def dropout_free_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint without dropout: two ranks and one process then draw nothing at random."""
    directory = tmp_path_factory.mktemp("tiny-no-dropout")
    for path in tiny_checkpoint.iterdir():
        shutil.copy(path, directory / path.name)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0,
                                                       "attention_probs_dropout_prob": 0.0}))
    return directory


def _multitask_flags(checkpoint, out, batch_size: int) -> list[str]:
    """multitask_classifier.py on the demo data in float32 (the weights are compared to 1e-5), its run in out/run
    and its six CSVs in out."""
    return ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
            "--precision", "fp32",
            "--batch_size", str(batch_size), "--lr", "1e-3", "--hidden_dropout_prob", "0", "--max_length", "32",
            "--max_train_examples", "40", "--first_stages", "qqp", "--cycle", "sts,sst", "--cycles", "1",
            "--output_dir", str(out / "run"), "--eval_batch_size", "16", *prediction_flags(out),
            "--keep_resume_state"]  # _trained_weights reads the finished run's training state


def _part_one_flags(checkpoint, out, batch_size: int) -> list[str]:
    """classifier.py (part one) on the demo data, its predictions in out/predictions."""
    return ["--pretrained", str(checkpoint), "--data_dir", str(DEMO), "--epochs", "2", "--max_train_examples", "24",
            "--batch_size", str(batch_size), "--lr", "1e-3", "--max_length", "32", "--hidden_dropout_prob", "0",
            "--option", "finetune", "--quiet", "--output_dir", str(out), "--predictions_dir", str(out / "predictions")]


@pytest.fixture(scope="module")
def whole_runs(dropout_free_checkpoint, tmp_path_factory):
    """Every whole run that the tests below compare, in two launches (a launch each took 10-25 s of interpreter
    starts on two cores): the two-process runs under one torchrun, then the one-process runs, which include
    resuming the two-process "parts" run. That run stops after stage 2 and resumes with other runs between
    them, so that what carries it on is its checkpoint, not something left in the processes. Returns the
    folder of the runs (each in folder/NAME) and their outcomes by name."""
    folder = tmp_path_factory.mktemp("whole-runs")
    checkpoint = dropout_free_checkpoint
    two_processes = [
        ["parts", "multitask_classifier",
         [*_multitask_flags(checkpoint, folder / "parts", 4), "--stop_after_stages", "2"]],
        ["two", "multitask_classifier", _multitask_flags(checkpoint, folder / "two", 4)],
        ["part-one-two", "classifier", _part_one_flags(checkpoint, folder / "part-one-two", 4)],
        ["parts-resumed", "multitask_classifier", [*_multitask_flags(checkpoint, folder / "parts", 4), "--resume"]]]
    one_process = [
        ["one", "multitask_classifier", _multitask_flags(checkpoint, folder / "one", 8)],
        ["part-one-one", "classifier", _part_one_flags(checkpoint, folder / "part-one-one", 8)],
        ["parts-resumed-by-one", "multitask_classifier",
         [*_multitask_flags(checkpoint, folder / "parts", 4), "--resume"]]]
    return folder, {**launch(folder, 2, two_processes), **launch(folder, 1, one_process)}


def _output(runs: dict, name: str, returncode: int = 0) -> tuple[str, str]:
    """A run's (stdout, stderr), once every rank of it has exited with returncode."""
    run = runs[name]
    assert set(run["returncodes"]) == {returncode}, (name, run["returncodes"], run["stderr"][-3000:])
    return run["stdout"], run["stderr"]


def _ids(out) -> dict[str, list[str]]:
    return {path.name: [line.split(",")[0] for line in path.read_text().splitlines()] for path in out.glob("*.csv")}


def _trained_weights(out) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(out / "run" / "last.safetensors")).items() if k.startswith("model.")}


@pytest.mark.distributed
def test_torchrun_two_processes_train_the_model_of_one_with_the_whole_batch(whole_runs):
    folder, runs = whole_runs
    log, _ = _output(runs, "two")
    _output(runs, "one")
    two, one = folder / "two", folder / "one"
    assert "data parallel: 2 processes x batch 4 x accumulation 1 = 8 examples per update" in log
    assert log.count("best model on dev") == 1  # rank 0 alone prints
    assert len(_ids(two)) == 6 and _ids(two) == _ids(one)  # every id once, in file order
    one_weights, two_weights = _trained_weights(one), _trained_weights(two)
    assert one_weights.keys() == two_weights.keys()
    for name, weight in one_weights.items():
        torch.testing.assert_close(two_weights[name], weight, rtol=0, atol=1e-5, msg=name)
    history = [json.loads(line) for line in (two / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["index"] for r in history] == [0, 1, 2, 3]


@pytest.mark.distributed
def test_torchrun_resumes_a_stopped_run(whole_runs):
    folder, runs = whole_runs
    _output(runs, "parts")
    _output(runs, "two")  # the same flags, not stopped
    log, _ = _output(runs, "parts-resumed")
    assert "resuming after stage 2 of 3" in log
    for name in ("sst-dev-out.csv", "para-test-out.csv", "sts-dev-out.csv"):
        assert (folder / "parts" / name).read_text() == (folder / "two" / name).read_text(), name
    _, error = _output(runs, "parts-resumed-by-one", returncode=2)
    assert "trained by 2 process(es), this one has 1" in error


@pytest.mark.distributed
def test_torchrun_trains_part_one_like_one_process_with_the_whole_batch(whole_runs):
    folder, runs = whole_runs
    predictions = {}
    for name in ("part-one-two", "part-one-one"):
        log, _ = _output(runs, name)
        assert sum("best dev acc" in line for line in log.splitlines()) == 1  # rank 0 alone prints
        predictions[name] = {p.name: p.read_text() for p in sorted((folder / name / "predictions").glob("*.csv"))}
    two, one = predictions["part-one-two"], predictions["part-one-one"]
    assert len(two) == 4 and two.keys() == one.keys()
    for name, text in two.items():
        rows, expected = text.splitlines(), one[name].splitlines()
        assert [r.split(",")[0] for r in rows] == [r.split(",")[0] for r in expected], name
        agreeing = sum(r == e for r, e in zip(rows, expected))
        assert agreeing >= 0.95 * len(rows), name  # a class on the edge may turn on a 1e-7 difference


def test_the_process_group_waits_long_enough_for_slow_checkpoint_writes(monkeypatch):
    """Rank 0 writes the stage checkpoint (Drive on Colab: minutes) while the others wait in a collective:
    the group is joined with an explicit timeout well past NCCL's 10-minute default."""
    import torch.distributed as dist
    joined = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: joined.update(backend=backend, **kwargs))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    distributed, device = Distributed.from_environment(use_gpu=False)
    assert (distributed.rank, distributed.world_size, device.type) == (1, 2, "cpu")
    assert joined["backend"] == "gloo" and joined["timeout"] >= datetime.timedelta(minutes=30)
