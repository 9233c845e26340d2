"""The thesis' own settings as options of the same code (issue 40, item 1): each stage going on from its block's
best dev epoch (--stage_start best, --simcse_keep best), SMART's per-example rescale projection (listing A.4), the
Bregman momentum restarting every stage and the anchor at the stage's first weights, and dropout before the STS
cosine (listing A.6). Issue 46, item 1: R_s reduced by the largest class term (listing A.1), the anchor's forward in
train mode, the --no- forms of the recipes' switches, SimCSE's pairwise loss and the thesis' pairing of NLI rows."""
import json
import math

import pytest
import torch
from test_trainer import demo_data, make_trainer, record_anchor_momentum

from conftest import deterministic_tiny_model, pair_batch, tiny_model
from minbert.data.nli import PAIRINGS, NLITriplet
from minbert.model.multitask_bert import trained_tensors
from minbert.training.penalties.smart import smart_configs
from minbert.run.run_setup import build_trainer, load_triplets
from minbert.run.training_args import TrainingArguments, build_parser
from minbert.training.simcse import SIMCSE_OBJECTIVES
from minbert.training.schedules import Stage, StageKind, block_length, parse_stage_list
from smart import (ANCHOR_MODES, REDUCTIONS, BregmanAnchor, SmartConfig, SmartRegularizer, adversarial_regularizer,
                   ascend, reduced_divergence)

pytestmark = pytest.mark.usefixtures("one_thread")

SST, QQP = Stage(StageKind.TASK, "sst"), Stage(StageKind.TASK, "qqp")


# ---------------------------------------------------------------------------------------------------
# --stage_start best, --simcse_keep best


def test_a_block_is_a_run_of_equal_consecutive_stages():
    stages = parse_stage_list("qqp,sts*3,sst,sst:0.5*2")
    assert [block_length(stages, i) for i in range(len(stages))] == [1, 3, 3, 3, 1, 2, 2]


def score_stages(monkeypatch, score) -> None:
    """Stage records scored by `score(record, tasks)`, for the block's best stage and the kept model alike."""
    for module in ("minbert.training.stage_transitions", "minbert.training.trainer"):
        monkeypatch.setattr(f"{module}.kept_model_score", score)


def weights_at_each_stage_start(trainer, monkeypatch) -> list[dict]:
    starts, run_stage = [], trainer.run_stage

    def recording(index, stage):
        starts.append({k: v.clone() for k, v in trained_tensors(trainer.model).items()})
        return run_stage(index, stage)
    monkeypatch.setattr(trainer, "run_stage", recording)
    return starts


def equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("stage_start", ["best", "last"])
def test_the_stage_after_a_block_starts_from_its_best_dev_epoch_with_best(tmp_path, tokenizer, monkeypatch,
                                                                          stage_start):
    trainer = make_trainer(tmp_path, tokenizer, stage_start=stage_start)
    scores = {1: 0.2, 2: 0.9, 3: 0.1, 4: 0.5, 5: 0.3}  # by stage: the sst block's best is its first epoch (stage 2)
    score_stages(monkeypatch, lambda record, tasks: scores[record["index"]])
    starts = weights_at_each_stage_start(trainer, monkeypatch)
    trainer.train([QQP, SST, SST, SST, QQP])
    after_first_sst = starts[2]
    assert equal(starts[4], after_first_sst) == (stage_start == "best")
    assert not equal(starts[3], after_first_sst)  # inside the block every epoch goes on from the one before
    assert trainer.transitions.block_best is None


def test_a_block_whose_last_epoch_is_best_goes_on_unchanged(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer, stage_start="best")
    score_stages(monkeypatch, lambda record, tasks: record["index"] / 10)
    starts = weights_at_each_stage_start(trainer, monkeypatch)
    trainer.train([SST, SST, QQP])
    assert not equal(starts[2], starts[1])


def test_a_resumed_block_goes_on_from_the_best_epoch_it_had_kept(tmp_path, tokenizer, monkeypatch):
    """The block's best weights travel in the training state: a run stopped inside a block and resumed ends as
    the uninterrupted run does."""
    scores = {1: 0.9, 2: 0.1, 3: 0.5}
    stages = [SST, SST, QQP]
    score_stages(monkeypatch, lambda record, tasks: scores.get(record["index"], 0.0))
    whole = make_trainer(tmp_path / "whole", tokenizer, stage_start="best")
    whole.train(stages)
    stopped = make_trainer(tmp_path / "parts", tokenizer, stage_start="best", stop_after_stages=1)
    stopped.train(stages)
    tensors, metadata = stopped.state_dict()
    assert metadata["block_best"] == {"index": 1, "score": 0.9}
    resumed = make_trainer(tmp_path / "parts", tokenizer, stage_start="best")
    resumed.load_state_dict(tensors, metadata)
    assert resumed.transitions.block_best.index == 1 and equal(resumed.transitions.block_best.tensors, stopped.transitions.block_best.tensors)
    resumed.train(stages)
    assert equal(trained_tensors(resumed.model), trained_tensors(whole.model))


def test_simcse_keep_best_goes_on_from_the_simcse_epoch_with_the_best_sts_dev(tmp_path, tokenizer, monkeypatch):
    settings = {"option": "finetune", "batch_size": 4, "lr": 1e-3, "max_length": 32, "quiet": True,
                "precision": "fp32", "output_dir": str(tmp_path / "run"), "simcse_keep": "best",
                "simcse_data": ["unused"]}
    triplets = [NLITriplet(f"a man sings {i}", f"a person sings {i}", f"nobody sings {i}") for i in range(8)]
    trainer = build_trainer(TrainingArguments(**settings), deterministic_tiny_model(), tokenizer, demo_data(),
                            triplets, torch.device("cpu"))
    picked = []

    def score(record, tasks):
        if record["stage"] == "simcse":
            picked.append(tasks)
        return {1: 0.8, 2: 0.3}.get(record["index"], 0.0)
    score_stages(monkeypatch, score)
    starts = weights_at_each_stage_start(trainer, monkeypatch)
    simcse = Stage(StageKind.SIMCSE)
    trainer.train([simcse, simcse, SST])
    assert equal(starts[2], starts[1])  # the first SimCSE epoch's weights
    assert {"sts"} in picked


def test_simcse_keep_best_needs_sts_among_the_tasks():
    with pytest.raises(ValueError) as refused:
        TrainingArguments(tasks="sst,qqp", simcse_keep="best")
    assert str(refused.value) == "--simcse_keep best picks the SimCSE epoch by STS's dev Pearson: add sts to --tasks"


# ---------------------------------------------------------------------------------------------------
# SMART: the rescale projection, the momentum schedule per stage, the anchor at the stage's start


def test_rescale_perturbs_every_example_at_inf_norm_eps_as_listing_a4():
    """One ascent step by hand: the random start rescaled to inf-norm eps per example, the gradient at that
    perturbation normalised per example, added to the unrescaled start, and the sum rescaled again."""
    config = SmartConfig(norm_level="sentence", projection="rescale", epsilon=1e-3, step_size=1e-2, noise_std=1e-3)
    torch.manual_seed(0)
    embeddings = torch.randn(3, 4, 5)
    weight = torch.randn(5, 2)

    def forward_fn(e):
        return (e.pow(2) @ weight).sum(dim=1)  # (B, 2): not linear, so the gradient depends on the perturbation
    clean = forward_fn(embeddings)
    torch.manual_seed(1)
    delta, finite = ascend(forward_fn, embeddings, clean, "squared", config)
    assert bool(finite)
    torch.manual_seed(1)
    start = torch.randn_like(embeddings) * config.noise_std

    def rescale(x):
        return x * config.epsilon / x.abs().amax(dim=(1, 2), keepdim=True)
    perturbation = rescale(start).requires_grad_()
    value = ((forward_fn(embeddings + perturbation) - clean) ** 2).sum(dim=1).mean()
    (gradient,) = torch.autograd.grad(value, perturbation)
    expected = rescale(start + config.step_size * gradient / gradient.abs().amax(dim=(1, 2), keepdim=True))
    torch.testing.assert_close(delta, expected)
    torch.testing.assert_close(delta.abs().amax(dim=(1, 2)), torch.full((3,), config.epsilon))


def test_clamp_leaves_most_entries_at_the_bound_and_rescale_only_the_largest():
    torch.manual_seed(0)
    embeddings = torch.randn(2, 6, 8)
    weight = torch.randn(8, 3)
    forward_fn = lambda e: (e.tanh() @ weight).mean(dim=1)  # noqa: E731
    clean = forward_fn(embeddings)
    fractions = {}
    for projection in ("clamp", "rescale"):
        config = SmartConfig(norm_level="sentence", projection=projection)
        delta, _ = ascend(forward_fn, embeddings, clean, "categorical", config)
        fractions[projection] = (delta.abs() > 0.999 * config.epsilon).float().mean().item()
    assert fractions["clamp"] > 0.9 and fractions["rescale"] < 0.2


def test_smart_config_refuses_an_unknown_projection():
    with pytest.raises(ValueError, match="projection"):
        SmartConfig(projection="sphere")


def test_the_stage_momentum_schedule_restarts_every_stage(tmp_path, tokenizer, monkeypatch):
    # Two stages of 40 SST examples in batches of 4: 10 updates each, the first of each (10%) at 0.99.
    trainer = make_trainer(tmp_path, tokenizer, data=demo_data(train=40, dev=4, test=2), smart=True,
                           smart_tasks="sst", smart_momentum_schedule="stage")
    momenta = record_anchor_momentum(trainer, monkeypatch)
    trainer.train([SST, SST])
    assert momenta == ([0.99] + [0.999] * 9) * 2


def test_the_stage_start_anchor_is_the_weights_each_stage_began_with(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer, data=demo_data(train=12, dev=4, test=2), smart=True,
                           smart_tasks="sst", smart_anchor="stage_start")
    anchor = trainer.penalty("smart").anchor
    monkeypatch.setattr(anchor, "update", lambda model: pytest.fail("the stage_start anchor never moves"))
    anchors, run_stage = [], trainer.run_stage

    def recording(index, stage):
        live = dict(trainer.model.named_parameters())
        anchors.append(all(torch.equal(anchor.params[n], live[n]) for n in anchor.params))
        return run_stage(index, stage)
    monkeypatch.setattr(trainer, "run_stage", recording)
    trainer.train([SST, QQP, SST])
    assert anchors == [True, True, True]


def test_anchor_reset_copies_the_live_weights():
    model = tiny_model()
    anchor = BregmanAnchor(model, 0.99)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    anchor.reset(model)
    assert all(torch.equal(anchor.params[n], p) for n, p in model.named_parameters())
    assert all(t.data_ptr() != p.data_ptr() for t, p in zip(anchor.params.values(), model.parameters()))


# ---------------------------------------------------------------------------------------------------
# Dropout before the STS cosine


def test_sts_cosine_dropout_drops_both_embeddings_in_training_only(tokenizer):
    batch = pair_batch(tokenizer, "sts", 4)
    for on in (False, True):
        model = deterministic_tiny_model(similarity_objective="shifted", sts_cosine_dropout=on)
        model.dropout.p = 0.5
        model.train()
        torch.manual_seed(0)
        first = model("sts", batch)
        second = model("sts", batch)
        assert torch.equal(first, second) != on
        model.eval()
        assert torch.equal(model("sts", batch), model("sts", batch))


def test_sts_cosine_dropout_round_trips_and_needs_a_cosine(tmp_path):
    from minbert.model.multitask_bert import load_multitask_model, save_multitask_model
    model = tiny_model(sts_cosine_dropout=True)
    save_multitask_model(model, tmp_path / "m", {})
    assert load_multitask_model(tmp_path / "m").task_options["sts_cosine_dropout"]
    with pytest.raises(ValueError, match="sts_cosine_dropout"):
        tiny_model(pair_encoder="sts:cross", sts_cosine_dropout=True)
    with pytest.raises(ValueError, match="--sts_cosine_dropout"):
        TrainingArguments(pair_encoder="sts:cross", sts_cosine_dropout=True)


# ---------------------------------------------------------------------------------------------------
# SMART as the thesis' listings compute it (issue 46): R_s's largest class term, the anchor's forward with dropout on


def test_r_s_reduced_by_max_is_the_largest_class_term_averaged_over_the_batch_by_hand():
    """softmax([0, ln 3]) = (1/4, 3/4) against (1/2, 1/2): the class terms (p - q)(log p - log q) are
    1/4 ln 2 and 1/4 ln(3/2); their sum (the symmetric KL) is 1/4 ln 3, their maximum 1/4 ln 2. The second example
    has no divergence, so the batch means are half of those."""
    logits_p = torch.tensor([[0.0, math.log(3)], [0.0, 0.0]])
    logits_q = torch.zeros(2, 2)
    assert reduced_divergence("categorical", logits_p, logits_q).item() == pytest.approx(math.log(3) / 8)
    assert reduced_divergence("categorical", logits_p, logits_q, "max").item() == pytest.approx(math.log(2) / 8)
    # QQP's single logit as listing A.3's two classes (1 - sigmoid, sigmoid): the same distributions.
    logit_p, logit_q = torch.tensor([math.log(3), 0.0]), torch.zeros(2)
    assert reduced_divergence("bernoulli", logit_p, logit_q).item() == pytest.approx(math.log(3) / 8)
    assert reduced_divergence("bernoulli", logit_p, logit_q, "max").item() == pytest.approx(math.log(2) / 8)
    # A regressor's one output has no classes: (1 - 0)^2 and (3 - 1)^2 averaged, whichever reduction (listing A.2).
    for reduction in REDUCTIONS:
        assert reduced_divergence("squared", torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0]),
                                  reduction).item() == pytest.approx(2.5)


def test_r_s_max_reduces_the_divergence_at_the_perturbation_the_summed_ascent_found():
    """Listing A.1's ascent differentiates the summed divergence and only R_s takes the maximum: the perturbation is
    the same for both reductions, and R_s is that perturbation's divergence reduced by each."""
    torch.manual_seed(0)
    embeddings, weight = torch.randn(3, 4, 5), torch.randn(5, 3)
    forward_fn = lambda e: (e.tanh() @ weight).mean(dim=1)  # noqa: E731 (B, 3) logits
    clean = forward_fn(embeddings)
    values, deltas = {}, {}
    for reduction in REDUCTIONS:
        config = SmartConfig(reduction=reduction, epsilon=0.05, noise_std=0.05, step_size=0.1)
        torch.manual_seed(1)
        values[reduction], skipped = adversarial_regularizer(forward_fn, embeddings, clean, "categorical", config)
        torch.manual_seed(1)
        deltas[reduction], _ = ascend(forward_fn, embeddings, clean, "categorical", config)
        assert not skipped
    torch.testing.assert_close(deltas["max"], deltas["sum"], rtol=0, atol=0)
    log_p, log_q = forward_fn(embeddings + deltas["max"]).log_softmax(-1), clean.log_softmax(-1)
    terms = (log_p.exp() - log_q.exp()) * (log_p - log_q)  # (B, 3)
    assert values["max"].item() == pytest.approx(terms.amax(dim=-1).mean().item(), rel=1e-5)
    assert values["sum"].item() == pytest.approx(terms.sum(dim=-1).mean().item(), rel=1e-5)
    assert values["max"] < values["sum"]


def test_smart_config_refuses_an_unknown_reduction_or_anchor_mode():
    with pytest.raises(ValueError, match="reduction must be one of"):
        SmartConfig(reduction="mean")
    with pytest.raises(ValueError, match="anchor_mode must be one of"):
        SmartConfig(anchor_mode="dropout")


class Dropped(torch.nn.Module):
    """A linear layer behind dropout: its outputs show which mode a forward ran in."""

    def __init__(self):
        super().__init__()
        self.dropout, self.linear = torch.nn.Dropout(0.5), torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.linear(self.dropout(x))


def test_the_anchor_in_train_mode_draws_dropout_masks_as_the_thesis_copy_does():
    torch.manual_seed(0)
    model, x = Dropped(), torch.randn(8, 6)
    anchor = BregmanAnchor(model, 0.99)
    model.eval()  # the anchor's forward restores whichever mode the model was in
    torch.manual_seed(1)
    in_train = anchor.outputs(model, (x,), mode="train")
    assert not model.training
    model.train()
    torch.manual_seed(1)
    assert torch.equal(in_train, model(x))  # the weights are the anchor's copy: the same masks give the same outputs
    assert torch.equal(anchor.outputs(model, (x,)), anchor(model, x)) and model.training
    model.eval()
    assert torch.equal(anchor(model, x), model(x))


@pytest.mark.parametrize("mode", ANCHOR_MODES)
def test_the_bregman_term_follows_the_configs_anchor_mode(mode):
    torch.manual_seed(0)
    model, x = Dropped(), torch.randn(8, 6)
    regularizer = SmartRegularizer(model, SmartConfig(adv_weight=0, anchor_mode=mode))
    clean = model.eval()(x)
    model.train()
    terms = [regularizer.penalty(model, x, clean, "categorical", anchor_args=(x,)) for _ in range(2)]
    assert torch.equal(terms[0], terms[1]) == (mode == "eval")  # dropout noise only in the train-mode anchor
    assert model.training


def test_smart_flags_and_overrides_reach_the_new_config_fields():
    args = TrainingArguments(smart=True, smart_reduction="max", smart_anchor_mode="train",
                             smart_override=["sst:reduction=sum,anchor_mode=eval"])
    configs = smart_configs(args)
    assert (configs["sst"].reduction, configs["sst"].anchor_mode) == ("sum", "eval")
    assert (configs["qqp"].reduction, configs["qqp"].anchor_mode) == ("max", "train")
    assert (SmartConfig().reduction, SmartConfig().anchor_mode) == ("sum", "eval")  # the project's, by default


def test_on_off_flags_that_recipes_set_can_be_turned_off_after_them():
    parser = build_parser(TrainingArguments)
    for name in ("smart", "sts_cosine_dropout", "quiet"):
        assert getattr(parser.parse_args([f"--{name}"]), name) is True
        assert getattr(parser.parse_args([f"--{name}", f"--no-{name}"]), name) is False
        assert getattr(parser.parse_args([]), name) is False  # the default as before: no saved setting changes


# ---------------------------------------------------------------------------------------------------
# SimCSE as the thesis' section 3.2.4.3 and listing B.1: a two-way softmax per triplet, every entailment x contradiction
# of a premise


def test_the_pairwise_loss_by_hand():
    """tau 1/2. Example 1: cos(a, p) = 1, cos(a, n) = 0, so -log(e^2 / (e^2 + 1)) = log(1 + e^-2); example 2:
    cos(a, p) = 0, cos(a, n) = 1, log(1 + e^2) = 2 + log(1 + e^-2). Their mean: 1 + log(1 + e^-2). The lengths
    (3, 2, 0.5) do not matter: cosines."""
    anchor = torch.tensor([[3.0, 0.0], [0.0, 2.0]])
    positive = torch.tensor([[0.5, 0.0], [1.0, 0.0]])
    negative = torch.tensor([[0.0, 2.0], [0.0, 3.0]])
    got = SIMCSE_OBJECTIVES["pairwise"](anchor, positive, negative, temperature=0.5)
    assert got.item() == pytest.approx(1 + math.log(1 + math.exp(-2)))


def test_the_thesis_pairing_reaches_the_runs_triplets(tmp_path):
    rows = [("P", "e1", "entailment"), ("P", "c1", "contradiction"), ("P", "e2", "entailment"),
            ("P", "c2", "contradiction"), ("P", "c3", "contradiction")]
    path = tmp_path / "nli.jsonl"
    path.write_text("".join(json.dumps({"premise": p, "hypothesis": h, "label": label}) + "\n" for p, h, label in rows))
    counts = {pairing: len(load_triplets(TrainingArguments(option="finetune", simcse_data=[str(path)],
                                                           simcse_pairing=pairing)))
              for pairing in PAIRINGS}
    assert counts == {"zip": 2, "product": 6}
