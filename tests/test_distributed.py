"""Data parallel training (distributed.py): sharded epochs, and two gloo processes on the CPU giving what
one process gives on the concatenated batch — one optimizer step with and without SMART, the gathered
SimCSE loss, and whole torchrun runs (with --resume). Deselect with -m "not distributed"."""
import datetime
import json
import os
import random
import shutil
import socket
import subprocess
import sys
from functools import partial

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from conftest import DEMO, MAX_LENGTH, ROOT, demo_examples, deterministic_tiny_model, prediction_flags
from datasets import LengthBucketSampler, collate_pairs, collate_sentences
from distributed import SINGLE_PROCESS, Distributed, cut_global_batches, data_parallel, global_batch_count
from mlm import mlm_batches
from simcse import NLITriplet, supervised_simcse_loss, triplet_batches
from tasks import MULTITASK

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


def _spawn(worker, *args, world_size: int = 2) -> None:
    mp.spawn(worker, args=(world_size, _free_port(), *args), nprocs=world_size, join=True)


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
    accumulated into one update. Returns the gradients the optimizer saw."""
    seen = {}
    step = trainer.optimizer.step

    def recording_step():
        seen.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        step()
    trainer.optimizer.step = recording_step
    if task in ("cagrad", "pcgrad"):
        trainer.args.gradient_surgery = task
        surgery = partial(trainer.surgery_step, rng=random.Random(0))
        trainer.run_steps([(surgery, list(batches.items()))], 1, "test", gradients_reduced=True)
    elif task == "accumulated":
        trainer.args.grad_accumulation_steps = 2
        trainer.run_steps([(partial(trainer.task_step, t), batches[t]) for t in ("sst", "sts")], 2, "test")
    else:
        trainer.run_steps([(partial(trainer.task_step, task), batches[task])], 1, "test")
    return seen


def _batches(task: str, tokenizer, rank: int = 0, world_size: int = 1) -> dict:
    """7 training examples per task (slices of 4 and 3 on two ranks: the weighting by share matters)."""
    tasks = {"cagrad": MULTITASK, "pcgrad": MULTITASK, "accumulated": ("sst", "sts")}.get(task, (task,))
    return {t: _batch(t, demo_examples(t, "train", 7)[rank::world_size], tokenizer) for t in tasks}


def _step_trainer(distributed, tmp_path, tokenizer, smart: bool):
    from trainer import Trainer
    from training_args import TrainingArguments
    from datasets import TaskData
    args = TrainingArguments(option="finetune", batch_size=4, lr=1e-3, max_length=MAX_LENGTH, quiet=True,
                             output_dir=str(tmp_path / "run"), smart=smart)
    data = {t: TaskData(demo_examples(t, "train", 8), demo_examples(t, "dev", 4), None) for t in MULTITASK}
    return Trainer(args, deterministic_tiny_model(), tokenizer, data, [], torch.device("cpu"), distributed=distributed)


def _step_worker(rank, world_size, port, task, smart, tmp_path):
    from tokenizer import BertTokenizer
    distributed = _join(rank, world_size, port)
    torch.randn_like = _shape_noise
    tokenizer = BertTokenizer.from_pretrained("minilm-l6")
    trainer = _step_trainer(distributed, tmp_path, tokenizer, smart)
    gradients = _one_step(trainer, task, _batches(task, tokenizer, rank, world_size))
    weights = {n: p.detach().contiguous() for n, p in trainer.model.named_parameters()}
    save_file({**{f"grad.{n}": g for n, g in gradients.items()}, **{f"weight.{n}": w for n, w in weights.items()}},
              str(tmp_path / f"rank{rank}.safetensors"))
    distributed.shutdown()


@pytest.mark.distributed
@pytest.mark.parametrize("task,smart", [("sst", False), ("sts", False), ("sst", True), ("qqp", True),
                                        ("cagrad", False), ("pcgrad", False), ("accumulated", True)])
def test_two_processes_take_the_step_of_one_on_the_whole_batch(tmp_path, tokenizer, monkeypatch, task, smart):
    _spawn(_step_worker, task, smart, tmp_path)
    monkeypatch.setattr(torch, "randn_like", _shape_noise)
    trainer = _step_trainer(SINGLE_PROCESS, tmp_path, tokenizer, smart)
    expected = _one_step(trainer, task, _batches(task, tokenizer))
    ranks = [load_file(str(tmp_path / f"rank{rank}.safetensors")) for rank in range(2)]
    assert ranks[0].keys() == ranks[1].keys() == {f"grad.{n}" for n in expected} | {
        f"weight.{n}" for n, _ in trainer.model.named_parameters()}
    for name, gradient in expected.items():
        for saved in ranks:
            torch.testing.assert_close(saved[f"grad.{name}"], gradient, rtol=1e-5, atol=1e-6)
    for name, weight in trainer.model.named_parameters():
        assert torch.equal(ranks[0][f"weight.{name}"], ranks[1][f"weight.{name}"]), name  # one model
        torch.testing.assert_close(ranks[0][f"weight.{name}"], weight.detach(), rtol=0, atol=1e-6)


def _simcse_worker(rank, world_size, port, tmp_path):
    distributed = _join(rank, world_size, port)
    full = load_file(str(tmp_path / "full.safetensors"))
    sizes = [3, 2]
    start = sum(sizes[:rank])
    local = {k: v[start:start + sizes[rank]].clone().requires_grad_() for k, v in full.items()}
    gathered = [distributed.gather_with_grad(local[k]) for k in ("anchor", "positive", "negative")]
    loss = supervised_simcse_loss(*gathered, temperature=0.05)
    (loss * distributed.world_size).backward()  # as Trainer.simcse_step: the average over ranks divides it
    save_file({"loss": loss.detach().reshape(1), **{f"grad.{k}": v.grad for k, v in local.items()}},
              str(tmp_path / f"rank{rank}.safetensors"))
    distributed.shutdown()


@pytest.mark.distributed
def test_the_gathered_simcse_loss_is_the_loss_of_the_whole_batch(tmp_path):
    generator = torch.Generator().manual_seed(0)
    full = {k: torch.randn(5, 16, generator=generator) for k in ("anchor", "positive", "negative")}
    save_file(full, str(tmp_path / "full.safetensors"))
    _spawn(_simcse_worker, tmp_path)
    leaves = {k: v.clone().requires_grad_() for k, v in full.items()}
    expected = supervised_simcse_loss(leaves["anchor"], leaves["positive"], leaves["negative"], 0.05)
    expected.backward()
    ranks = [load_file(str(tmp_path / f"rank{rank}.safetensors")) for rank in range(2)]
    for saved in ranks:
        torch.testing.assert_close(saved["loss"][0], expected.detach())
    for k, leaf in leaves.items():
        # Each rank gets world_size x the whole batch's gradient of its own rows, which the average of
        # the parameters' gradients over ranks divides again.
        torch.testing.assert_close(torch.cat([ranks[0][f"grad.{k}"], ranks[1][f"grad.{k}"]]) / 2, leaf.grad)


def _gradient_worker(rank, world_size, port, tmp_path):
    distributed = _join(rank, world_size, port)
    both, only_rank0, neither = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    both.grad = torch.full((2,), float(rank + 1))
    if rank == 0:
        only_rank0.grad = torch.full((2,), 4.0)
    distributed.average_gradients([both, only_rank0, neither])
    save_file({"both": both.grad, "only_rank0": only_rank0.grad, "neither": torch.tensor([neither.grad is None])},
              str(tmp_path / f"rank{rank}.safetensors"))
    distributed.shutdown()


@pytest.mark.distributed
def test_gradient_average_keeps_absent_gradients_absent(tmp_path):
    _spawn(_gradient_worker, tmp_path)
    for rank in range(2):
        saved = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        assert saved["both"].tolist() == [1.5, 1.5]
        assert saved["only_rank0"].tolist() == [2.0, 2.0]  # a zero on the rank without it
        assert saved["neither"].item()  # the optimizer skips it, as in one process


def _recording_group(monkeypatch) -> list[str]:
    """data_parallel on a two-rank Distributed whose barrier and shutdown record their calls (no processes)."""
    calls = []

    class Recording(Distributed):
        def barrier(self):
            calls.append("barrier")

        def shutdown(self):
            calls.append("shutdown")

    monkeypatch.setattr(Distributed, "from_environment",
                        classmethod(lambda cls, use_gpu: (Recording(0, 0, 2), torch.device("cpu"))))
    return calls


def test_ranks_leave_the_group_together_after_a_run(monkeypatch):
    calls = _recording_group(monkeypatch)
    with data_parallel(use_gpu=False) as (distributed, _):
        assert distributed.enabled
    assert calls == ["barrier", "shutdown"]  # no rank tears gloo down while another still uses it


def test_a_failed_rank_leaves_the_group_without_waiting_for_the_others(monkeypatch):
    calls = _recording_group(monkeypatch)
    with pytest.raises(RuntimeError), data_parallel(use_gpu=False):
        raise RuntimeError("a rank fails")
    assert calls == ["shutdown"]  # a barrier here would hang: the other ranks never reach it


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


def _run(tmp_path, name: str, checkpoint, processes: int, batch_size: int, *extra: str, returncode: int = 0):
    """multitask_classifier.py on the demo data (torchrun when processes > 1); (output folder, stdout, stderr)."""
    command = [sys.executable, "multitask_classifier.py"]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                   "multitask_classifier.py"]
    out = tmp_path / name
    flags = ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
             "--batch_size", str(batch_size), "--lr", "1e-3", "--hidden_dropout_prob", "0", "--max_length", "32",
             "--max_train_examples", "40", "--first_stages", "qqp", "--cycle", "sts,sst", "--cycles", "1",
             "--output_dir", str(out / "run"), "--eval_batch_size", "16", *prediction_flags(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command + flags + list(extra), cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == returncode, result.stderr[-3000:]
    return out, result.stdout, result.stderr


def _ids(out) -> dict[str, list[str]]:
    return {path.name: [line.split(",")[0] for line in path.read_text().splitlines()] for path in out.glob("*.csv")}


def _trained_weights(out) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(out / "run" / "last.safetensors")).items() if k.startswith("model.")}


@pytest.mark.distributed
def test_torchrun_two_processes_train_the_model_of_one_with_the_whole_batch(tmp_path, dropout_free_checkpoint):
    two, log, _ = _run(tmp_path, "two", dropout_free_checkpoint, 2, 4)
    one, _, _ = _run(tmp_path, "one", dropout_free_checkpoint, 1, 8)
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
def test_torchrun_resumes_a_stopped_run(tmp_path, dropout_free_checkpoint):
    whole, _, _ = _run(tmp_path, "whole", dropout_free_checkpoint, 2, 4)
    _run(tmp_path, "parts", dropout_free_checkpoint, 2, 4, "--stop_after_stages", "2")
    parts, log, _ = _run(tmp_path, "parts", dropout_free_checkpoint, 2, 4, "--resume")
    assert "resuming after stage 2 of 3" in log
    for name in ("sst-dev-out.csv", "para-test-out.csv", "sts-dev-out.csv"):
        assert (parts / name).read_text() == (whole / name).read_text(), name
    _, _, error = _run(tmp_path, "parts", dropout_free_checkpoint, 1, 4, "--resume", returncode=2)
    assert "trained by 2 process(es), this one has 1" in error


@pytest.mark.distributed
def test_torchrun_trains_part_one_like_one_process_with_the_whole_batch(tmp_path, dropout_free_checkpoint):
    def run(name: str, processes: int, batch_size: int) -> dict[str, str]:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes > 1 else []
        flags = ["--pretrained", str(dropout_free_checkpoint), "--data_dir", str(DEMO), "--epochs", "2",
                 "--max_train_examples", "24", "--batch_size", str(batch_size), "--lr", "1e-3", "--max_length", "32",
                 "--hidden_dropout_prob", "0", "--option", "finetune", "--quiet",
                 "--output_dir", str(tmp_path / name), "--predictions_dir", str(tmp_path / name / "predictions")]
        result = subprocess.run([sys.executable, *launcher, "classifier.py", *flags], cwd=ROOT, capture_output=True,
                                text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
        assert sum("best dev acc" in line for line in result.stdout.splitlines()) == 1  # rank 0 alone prints
        return {p.name: p.read_text() for p in sorted((tmp_path / name / "predictions").glob("*.csv"))}

    two, one = run("two", 2, 4), run("one", 1, 8)
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
