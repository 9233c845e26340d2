"""The training step at the hardware's pace, checked on the CPU: no host sync in a plain step and one at most in a
SMART step (the layout comes from the collate's host lengths, losses stay on the device), packed and padded layouts
that agree, length buckets, a compiled encoder equal to the eager one without graph breaks, and a run that stops at
its first non-finite loss."""
import dataclasses
import math

import numpy as np
import pytest
import torch
from test_trainer import make_trainer
from torch.utils._python_dispatch import TorchDispatchMode

import minbert.step_log as step_log
import multitask_classifier as mc
from conftest import (DEMO, MAX_LENGTH, demo_examples, deterministic_tiny_model, prediction_flags, skip_figures,
                      tiny_bert)
from minbert.data.batches import TokenizedExamples, tokenized_dataloader
from minbert.runtime import bucket_length
from minbert.step_log import StageLosses, TrainingDiverged

pytestmark = pytest.mark.usefixtures("one_thread")

# What makes the host wait for the device: a value read back, or a count only the device knows.
SYNC_OPS = ("aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero")


class HostSyncs(TorchDispatchMode):
    """Counts the operators that read a device value back to the host (on the CPU: the ones that would)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in SYNC_OPS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def count_syncs(fn) -> list[str]:
    with HostSyncs() as syncs:
        fn()
    return syncs.seen


class RecordedObjective:
    """A task's objective as the step loop calls it, that also hands each batch's loss to `record`."""

    def __init__(self, objective, record):
        self.objective, self.record = objective, record

    def __call__(self, model, batch):
        loss, terms = self.objective(model, batch)
        self.record(loss)
        return loss, terms

    def local_items(self, batch):
        return self.objective.local_items(batch)


def syncs_per_step(trainer, name: str, batch: dict) -> list[str]:
    """The host syncs one more training step adds to a stage as run_steps takes it (forward, backward, the update):
    a stage of two steps' less a stage of one's (the stage's end reads its losses back), after a stage that makes
    the optimizer's state."""
    def stage(steps: int) -> list[str]:
        return count_syncs(lambda: trainer.loop.run_steps([[(name, batch)]] * steps, steps, "test"))
    stage(1)
    one, two = stage(1), stage(2)
    for sync in one:
        two.remove(sync)
    return two


def batch_of(tokenizer, task: str, n: int = 6, pad_to_multiple_of: int | None = None, cross: bool = False) -> dict:
    examples = TokenizedExamples.tokenize(demo_examples(task, "train", n), tokenizer, MAX_LENGTH, cross)
    return examples.collate(range(n), pad_to_multiple_of)


# ---------------------------------------------------------------------------------------------------
# The layout: from the host's lengths, packed or on the padded grid


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("task", ["sst", "qqp"])
def test_a_forward_and_backward_read_nothing_back_when_the_batch_brings_its_lengths(tokenizer, task, pack):
    model = deterministic_tiny_model()
    model.bert.encoder.pack_tokens = pack
    batch = batch_of(tokenizer, task)
    assert count_syncs(lambda: model(task, batch).sum().backward()) == []
    without_lengths = {k: v for k, v in batch.items() if not k.startswith("lengths")}
    # Without host lengths the packed layout must ask the device where the real tokens are; the grid need not.
    assert bool(count_syncs(lambda: model(task, without_lengths))) == pack


@pytest.mark.parametrize("task", ["sst", "qqp", "sts"])
def test_packed_padded_and_bucketed_batches_give_the_same_outputs_and_gradients(tokenizer, task):
    results = {}
    for pack in (True, False):
        for multiple in (None, 32):
            model = deterministic_tiny_model()
            model.bert.encoder.pack_tokens = pack
            batch = batch_of(tokenizer, task, pad_to_multiple_of=multiple)
            outputs = model(task, batch)
            outputs.float().pow(2).sum().backward()
            results[pack, multiple] = outputs.detach(), {n: p.grad for n, p in model.named_parameters()
                                                         if p.grad is not None}
    reference_outputs, reference_grads = results[True, None]
    for outputs, grads in results.values():
        torch.testing.assert_close(outputs, reference_outputs, rtol=1e-5, atol=1e-6)
        for name, grad in reference_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_padding_positions_of_the_encoder_output_are_zero_on_both_layouts(tokenizer):
    batch = batch_of(tokenizer, "sst", pad_to_multiple_of=32)
    for pack in (True, False):
        bert = tiny_bert()
        bert.encoder.pack_tokens = pack
        layout = bert.encoder.layout(batch["attention_mask"], batch["lengths"])
        hidden = bert.encode(bert.embed(batch["input_ids"]), batch["attention_mask"], layout)
        padding = batch["attention_mask"] == 0
        assert padding.any() and hidden[padding].abs().max() == 0


def test_lengths_that_do_not_fit_the_batch_are_refused(tokenizer):
    batch = batch_of(tokenizer, "sst", 3)
    encoder = tiny_bert().encoder
    for lengths in ([1, 2], [1, 2, batch["input_ids"].shape[1] + 1], [-1, 2, 3]):
        with pytest.raises(ValueError, match="do not fit"):
            encoder.layout(batch["attention_mask"], lengths)


# ---------------------------------------------------------------------------------------------------
# Length buckets


def test_bucket_lengths_are_multiples_capped_at_max_length():
    assert [bucket_length(n, 32, 128) for n in (1, 32, 33, 100, 128)] == [32, 32, 64, 128, 128]
    assert bucket_length(90, 32, 100) == 96 and bucket_length(97, 32, 100) == 100
    assert bucket_length(17, None, 128) == 17


def test_bucketed_loaders_pad_to_few_shapes_and_keep_the_tokens(tokenizer):
    examples = TokenizedExamples.tokenize(demo_examples("qqp", "train", 64), tokenizer, 48)
    widths = set()
    for plain, bucketed in zip(tokenized_dataloader(examples, 8, shuffle=False),
                               tokenized_dataloader(examples, 8, shuffle=False, pad_to_multiple_of=16)):
        for side in ("_1", "_2"):
            width = plain["input_ids" + side].shape[1]
            widths.add(bucketed["input_ids" + side].shape[1])
            assert bucketed["input_ids" + side].shape[1] == bucket_length(width, 16, 48)
            assert torch.equal(bucketed["input_ids" + side][:, :width], plain["input_ids" + side])
            assert not bucketed["attention_mask" + side][:, width:].any()
            assert np.array_equal(bucketed["lengths" + side], plain["lengths" + side])
    assert widths <= {16, 32, 48}


# ---------------------------------------------------------------------------------------------------
# The trainer's step: host syncs and the losses


def first_batch(trainer, task: str) -> dict:
    return next(iter(trainer.stage_data.train_loader(task, seed=0)))


@pytest.mark.parametrize("task", ["sst", "qqp", "sts"])
def test_a_plain_training_step_waits_for_the_device_nowhere(tmp_path, tokenizer, task):
    trainer = make_trainer(tmp_path, tokenizer, max_grad_norm=1.0, weight_decay=0.01)
    batch = first_batch(trainer, task)
    assert syncs_per_step(trainer, task, batch) == []


def test_a_smart_step_reads_one_flag_back(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, smart=True, smart_adv_weight=1.0, smart_bregman_weight=1.0)
    batch = first_batch(trainer, "sst")
    syncs = syncs_per_step(trainer, "sst", batch)
    assert syncs == ["aten::is_nonzero"] or syncs == ["aten::_local_scalar_dense"]


def test_losses_are_read_back_every_logging_steps_updates_and_at_the_stage_end(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer, logging_steps=2)
    batch = first_batch(trainer, "sst")
    steps = [[("sst", batch)]] * 5
    transfers = []  # one stacked read (tolist, which the dispatch counter does not see) per line of steps.jsonl

    original = step_log.read_back

    def read_back(values):
        transfers.append(trainer.state.updates)
        return original(values)
    monkeypatch.setattr(step_log, "read_back", read_back)
    seen = count_syncs(lambda: trainer.loop.run_steps(iter(steps), 5, "stage 1 sst"))
    # updates 2 and 4 log, and the stage's end (its last line; then its mean and the divergence flag again)
    assert transfers == [2, 4, 5] and len(seen) == 2, (transfers, seen)


def test_stage_losses_average_on_the_device_and_name_the_first_non_finite_update():
    losses = StageLosses(torch.device("cpu"))
    for update, value in enumerate([1.0, 3.0]):
        losses.add(torch.tensor(value), update)
    assert losses.read_recent("stage 1 sst") == (2.0, {})
    losses.add(torch.tensor(5.0), 2)
    assert losses.read_recent("stage 1 sst", {"x": torch.tensor(7.0)}) == (5.0, {"x": 7.0})
    assert losses.read_mean("stage 1 sst") == 3.0
    losses.add(torch.tensor(float("nan")), 3)
    losses.add(torch.tensor(float("inf")), 4)
    with pytest.raises(TrainingDiverged, match="in stage 2 qqp: the loss of update 4 of the run is not finite"):
        losses.read_mean("stage 2 qqp")
    assert math.isnan(StageLosses(torch.device("cpu")).read_mean("a stage of no step"))


def test_a_diverging_run_stops_with_one_line_naming_the_stage_and_update(tiny_checkpoint, tmp_path, capsys,
                                                                      monkeypatch):
    skip_figures(monkeypatch)
    flags = ["--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
             "--max_train_examples", "16", "--max_length", "32", "--batch_size", "4", "--first_stages", "sst,qqp",
             "--cycles", "0", "--precision", "fp32", "--lr", "1e30", "--output_dir", str(tmp_path / "run"),
             *prediction_flags(tmp_path)]
    assert mc.main(flags) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: training diverged in stage 1 sst: the loss of update ")
    assert not (tmp_path / "run" / "best.safetensors").exists()


# ---------------------------------------------------------------------------------------------------
# --compile


def test_the_encoder_layers_compile_as_one_graph(tokenizer):
    for pack in (True, False):
        bert = tiny_bert()
        bert.encoder.pack_tokens = pack
        batch = batch_of(tokenizer, "sst")
        layout = bert.encoder.layout(batch["attention_mask"], batch["lengths"])
        explained = torch._dynamo.explain(bert.encoder.run_layers)(bert.embed(batch["input_ids"]), layout)
        assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_a_compiled_encoder_equals_the_eager_one_forward_and_backward(tokenizer):
    torch._dynamo.reset()
    batch = batch_of(tokenizer, "qqp")
    results = []
    for compiled in (False, True):
        model = deterministic_tiny_model()
        if compiled:
            model.bert.encoder.compile_layers(backend="aot_eager")  # the graph and its autograd, without codegen
        outputs = model("qqp", batch)
        outputs.pow(2).sum().backward()
        results.append((outputs.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(results[1][0], results[0][0])
    for compiled_grad, eager_grad in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(compiled_grad, eager_grad)
    assert set(deterministic_tiny_model().state_dict()) == set(model.state_dict())  # checkpoints keep their names


@pytest.mark.slow
def test_an_inductor_compiled_training_step_equals_the_eager_one(tmp_path, tokenizer):
    """The real backend (C++ code generated on the CPU; about half a minute): the whole step under --compile."""
    torch._dynamo.reset()
    losses = []
    for compiled in (False, True):
        trainer = make_trainer(tmp_path / str(compiled), tokenizer, compile=compiled)
        if compiled:
            trainer.model.bert.encoder.compile_layers()
        batch = first_batch(trainer, "sts")
        losses.append([])
        trainer.loop.objectives["sts"] = RecordedObjective(trainer.loop.objective("sts"),
                                                           lambda loss: losses[-1].append(loss.item()))
        trainer.loop.config = dataclasses.replace(trainer.config, grad_accumulation_steps=2)
        torch.manual_seed(0)
        trainer.loop.run_steps([[("sts", batch)]] * 3, 3, "test")  # two batches, the update, then one
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


def test_a_ranks_share_of_the_global_batch_stays_on_the_device(monkeypatch):
    """Under torchrun every micro-step weighs its loss by its rank's share of the global batch: a 0-dim tensor from
    the all-reduce, which nothing reads back (it read .item() before)."""
    import torch.distributed as dist

    from minbert.distributed import Distributed
    monkeypatch.setattr(dist, "all_reduce", lambda tensor: tensor.mul_(2))  # two ranks of equal counts
    rank = Distributed(rank=0, world_size=2)
    shares = []
    assert count_syncs(lambda: shares.append(rank.share(torch.tensor(6), torch.device("cpu")))) == []
    assert torch.is_tensor(shares[0]) and shares[0].item() == 1.0 and rank.share(3, torch.device("cpu")).item() == 1.0


def test_an_mlm_step_reads_nothing_back_and_equals_finding_the_masked_positions_on_the_device(tmp_path, tokenizer):
    from minbert.training.mlm import MaskedLanguageModelHead, mlm_batches, mlm_loss
    trainer = make_trainer(tmp_path, tokenizer, mlm_epochs=1)
    trainer.parts.mlm_head = MaskedLanguageModelHead(trainer.model.bert.config)  # what the command line builds beside it
    batch = next(mlm_batches([e.sentence for e in demo_examples("sst", "train", 8)], tokenizer, 8, 0, MAX_LENGTH))
    assert syncs_per_step(trainer, "mlm", batch) == []
    bert = tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    head = MaskedLanguageModelHead(bert.config)
    on_the_device = {k: v for k, v in batch.items() if k not in ("lengths", "masked")}
    assert len(batch["masked"]) > 0
    torch.testing.assert_close(mlm_loss(bert, head, batch), mlm_loss(bert, head, on_the_device))
