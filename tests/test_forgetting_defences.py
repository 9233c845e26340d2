"""EWC and L2-SP in the sequential schedule (issue 40, item 4): their penalties in every task step's loss, against
hand-computed values; the Fisher consolidated when a block of one task's stages gives way to the next (never after
the last stage), from that stage's batches by the task's loss alone; both kept across --resume; and the flags."""
import json

import pytest
import torch
from test_trainer import demo_data, make_trainer

from conftest import deterministic_tiny_model, pair_batch, sentence_batch
from minbert.model.multitask_bert import freeze_encoder, trained_tensors
from minbert.run.training_args import TrainingArguments, adapter_config
from minbert.training.continual import ElasticWeightConsolidation
from minbert.training.schedules import Stage, StageKind
from minbert.training.objective import compute_task_loss

pytestmark = pytest.mark.usefixtures("one_thread")

SST, QQP, STS = (Stage(StageKind.TASK, task) for task in ("sst", "qqp", "sts"))


def moved(trainer, by: float = 0.01) -> dict[str, torch.Tensor]:
    """Shift every weight by a known amount (what training would do) and return the weights before."""
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with torch.no_grad():
        for index, p in enumerate(trainer.model.parameters()):
            p.add_(by * (index % 3 + 1))
    return before


def test_the_penalties_are_added_to_the_task_loss_as_computed_by_hand(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, ewc_weight=3.0, l2sp_weight=0.5)
    model, ewc_penalty, l2sp_penalty = trainer.model, trainer.penalty("ewc"), trainer.penalty("l2sp")
    pretrained = moved(trainer)
    # A Fisher and an anchor set by hand on the encoder parameters EWC holds.
    anchor = {name: pretrained[name] + 0.005 for name in ewc_penalty.names}
    fisher = {name: torch.rand_like(p) for name, p in anchor.items()}
    ewc_penalty.fisher, ewc_penalty.anchor = fisher, anchor
    live = dict(model.named_parameters())
    encoder = [name for name in live if name.startswith("bert.")]
    assert set(ewc_penalty.names) == set(encoder) == set(l2sp_penalty.start)
    ewc = 0.5 * 3.0 * sum((fisher[n] * (live[n] - anchor[n]) ** 2).sum() for n in encoder)
    l2sp = 0.5 * 0.5 * sum(((live[n] - pretrained[n]) ** 2).sum() for n in encoder)
    batch = sentence_batch(tokenizer, 4)
    model.eval()
    plain, _ = compute_task_loss(model, "sst", batch)
    loss, penalties = compute_task_loss(model, "sst", batch, trainer.penalties)
    torch.testing.assert_close(penalties["ewc"], ewc.detach())
    torch.testing.assert_close(penalties["l2sp"], l2sp.detach())
    torch.testing.assert_close(loss, plain + ewc + l2sp)
    # and the gradient of the penalties reaches the encoder: d/dtheta = lambda F (theta - theta*) + alpha (theta - theta0)
    model.zero_grad()
    (loss - plain).backward()
    name = encoder[0]
    expected = 3.0 * fisher[name] * (live[name] - anchor[name]) + 0.5 * (live[name] - pretrained[name])
    torch.testing.assert_close(live[name].grad, expected.detach())


def test_a_training_step_trains_on_the_penalties(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, l2sp_weight=2.0)
    pretrained = moved(trainer)
    batch = pair_batch(tokenizer, "sts", 4)
    trainer.loop.optimizer_step = lambda *args, **kwargs: (torch.zeros(()), True)  # the weights stay where the loss was
    loss = trainer.loop.run_steps([[("sts", batch)]], 1, "test")
    trainer.model.eval()
    live = dict(trainer.model.named_parameters())
    expected = compute_task_loss(trainer.model, "sts", batch)[0] + sum(
        ((live[n] - pretrained[n]) ** 2).sum() for n in trainer.penalty("l2sp").start)
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    (line,) = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()  # the step's line reports its term
    assert "l2sp" in json.loads(line)


def test_l2sp_holds_the_pretrained_weights_and_ewc_the_shared_encoder_with_adapters(tmp_path, tokenizer):
    settings = dict(option="pretrain", adapter="lora", adapter_sharing="shared", ewc_weight=1.0)
    model = deterministic_tiny_model(adapter=adapter_config(TrainingArguments(**settings)))
    freeze_encoder(model)  # as multitask_classifier.build_model does with --option pretrain
    trainer = make_trainer(tmp_path, tokenizer, model=model, **settings)
    names = trainer.penalty("ewc").names
    assert names and all(".adapters.shared." in name for name in names)  # BERT's own weights are frozen
    with pytest.raises(ValueError, match="--l2sp_weight"):
        TrainingArguments(option="pretrain", adapter="lora", adapter_sharing="shared", l2sp_weight=1.0)


def consolidations(trainer, monkeypatch) -> list[tuple[str, int, dict]]:
    """(task, batches the Fisher read, the weights it was taken at) of every consolidation."""
    calls, consolidate = [], ElasticWeightConsolidation.consolidate

    def recording(self, model, batch_losses):
        counted = []

        def counting():
            for loss in batch_losses():
                counted.append(loss)
                yield loss
        consolidate(self, model, counting)
        calls.append((trainer.model.adapter_task, len(counted), {k: v.clone() for k, v in
                                                                 trained_tensors(trainer.model).items()}))
    monkeypatch.setattr(ElasticWeightConsolidation, "consolidate", recording)
    return calls


def test_the_fisher_is_consolidated_at_each_block_end_but_not_after_the_last_stage(tmp_path, tokenizer, monkeypatch):
    # 16 SST examples in batches of 4: 4 batches a stage, of which the Fisher reads 3.
    trainer = make_trainer(tmp_path, tokenizer, ewc_weight=1.0, ewc_fisher_batches=3)
    calls = consolidations(trainer, monkeypatch)
    starts, run_stage = [], trainer.run_stage

    def recording(index, stage):
        starts.append({k: v.clone() for k, v in trained_tensors(trainer.model).items()})
        return run_stage(index, stage)
    monkeypatch.setattr(trainer, "run_stage", recording)
    trainer.train([SST, SST, QQP, STS])
    assert [batches for _, batches, _ in calls] == [3, 3]  # after the SST block and after QQP; not after STS
    for (_, _, weights), start in zip(calls, (starts[2], starts[3])):
        assert all(torch.equal(weights[k], start[k]) for k in weights)  # at the weights the next stage starts from
    ewc = trainer.penalty("ewc")
    assert all(torch.equal(ewc.anchor[n], starts[3][n]) for n in ewc.names)


def test_the_fisher_uses_the_task_loss_alone(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer, ewc_weight=1.0, ewc_fisher_batches=2, smart=True, smart_tasks="sst",
                           lnsr=True, lnsr_tasks="sst")
    seen = []

    def spy(model, task, batch, penalties=()):
        seen.append(list(penalties))
        return original(model, task, batch, penalties)
    original = compute_task_loss
    monkeypatch.setattr("minbert.training.trainer.compute_task_loss", spy)
    trainer.train([SST, QQP])
    assert seen == [[]] * 2


def test_ewc_and_the_block_best_survive_a_resume(tmp_path, tokenizer):
    stages = [SST, QQP, STS]
    whole = make_trainer(tmp_path / "whole", tokenizer, ewc_weight=50.0, l2sp_weight=1.0, ewc_fisher_batches=2)
    whole.train(stages)
    stopped = make_trainer(tmp_path / "parts", tokenizer, ewc_weight=50.0, l2sp_weight=1.0, ewc_fisher_batches=2,
                           stop_after_stages=2)
    stopped.train(stages)
    tensors, metadata = stopped.state_dict()
    assert {k for k in tensors if k.startswith("ewc.")} == {f"ewc.{kind}.{n}" for kind in ("fisher", "anchor")
                                                            for n in stopped.penalty("ewc").names}
    resumed = make_trainer(tmp_path / "parts", tokenizer, ewc_weight=50.0, l2sp_weight=1.0, ewc_fisher_batches=2)
    resumed.load_state_dict(tensors, metadata)
    assert all(torch.equal(resumed.penalty("ewc").fisher[n], f) for n, f in stopped.penalty("ewc").fisher.items())
    resumed.train(stages)
    assert all(torch.equal(a, b) for a, b in zip(trained_tensors(resumed.model).values(),
                                                 trained_tensors(whole.model).values()))


@pytest.mark.parametrize("settings, problem", [
    ({"ewc_weight": -1.0}, "--ewc_weight must be"),
    ({"l2sp_weight": float("nan")}, "--l2sp_weight must be"),
    ({"ewc_fisher_batches": 0}, "--ewc_fisher_batches must be"),
    ({"ewc_weight": 1.0, "schedule": "annealed"}, "--schedule sequential"),
    ({"ewc_weight": 1.0, "option": "pretrain"}, "--ewc_weight holds"),
])
def test_bad_defence_flags_are_refused(settings, problem):
    with pytest.raises(ValueError, match=problem):
        TrainingArguments(**{"option": "finetune", **settings})


def test_defences_are_off_by_default(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, data=demo_data(train=4, dev=4, test=2))
    assert trainer.penalties == []
