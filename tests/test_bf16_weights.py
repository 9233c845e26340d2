"""--bf16_weights (minbert/training/precision.py): under bf16 autocast the nn.Linear layers read bf16 copies of their
weights that AdamW rewrites in its update, so a step casts no weight; the copies follow every other change of the
weights, float32 passes and other weights (functional_call) read the parameters, and the steps are those of
autocast's casts."""
import pytest
import torch
from safetensors.torch import load_file

import multitask_classifier as mc
from conftest import DEMO, exit_code, prediction_flags, sentence_batch, skip_figures, tiny_model
from minbert.runtime import float32_exact
from minbert.training.objective import TaskObjective
from minbert.training.optimization import build_optimizer
from minbert.training.precision import count_dispatches, keep_bf16_copies
from minbert.benchmarks.bf16_weights import TINY, compare_runs, plain_step
from optimizer import AdamW

pytestmark = pytest.mark.usefixtures("one_thread")


def model_and_optimizer(bf16_weights: bool):
    model = tiny_model(0)
    return model, build_optimizer(model, 1e-3, 0.01, bf16_weights=bf16_weights)


@pytest.mark.parametrize("bf16_weights, casts_weights", [(False, True), (True, False)])
def test_a_bf16_step_with_the_copies_casts_no_weight(tokenizer, bf16_weights, casts_weights):
    model, optimizer = model_and_optimizer(bf16_weights)
    objective, batch = TaskObjective("sst", []), sentence_batch(tokenizer)
    plain_step(model, optimizer, objective, batch)  # the copies are already rewritten by an update
    counts = count_dispatches(lambda: plain_step(model, optimizer, objective, batch), model.parameters())
    assert (counts.weight_casts > 0) == casts_weights


@pytest.mark.parametrize("task", ["sst", "sts"])
def test_the_copies_train_as_autocasts_casts_do(task):
    """The bf16 copy is the parameter rounded as autocast rounds it, and its gradient cast up as autocast casts it:
    the same losses and weights, bit for bit, on the CPU (where no autocast region reads a weight twice)."""
    compared = compare_runs(TINY, task, steps=6)
    assert compared["max_loss_difference"] == 0 and compared["max_weight_difference"] == 0


def linear_outputs(model, batch) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model.predict_sentiment(batch["input_ids"], batch["attention_mask"])


def test_the_copies_follow_weights_changed_outside_the_optimizer(tokenizer):
    """A checkpoint loaded (a resume, a stage's best restored) changes the parameters in place: the next forward
    rewrites the copies."""
    model, optimizer = model_and_optimizer(True)
    model.eval()
    batch = sentence_batch(tokenizer)
    linear_outputs(model, batch)
    other = tiny_model(1).eval()
    model.load_state_dict(other.state_dict())
    assert torch.equal(linear_outputs(model, batch), linear_outputs(other, batch))


def test_float32_passes_and_other_weights_read_the_parameters(tokenizer):
    """SMART's exact float32 passes (autocast off) compute in float32 from the float32 weights, and a forward with
    other weights (functional_call: SMART's anchor) reads those weights, not the model's copies."""
    model, _ = model_and_optimizer(True)
    plain, other = tiny_model(0).eval(), tiny_model(1)
    model.eval()
    batch = sentence_batch(tokenizer)
    with float32_exact():
        exact = model.predict_sentiment(batch["input_ids"], batch["attention_mask"])
        assert exact.dtype == torch.float32
        assert torch.equal(exact, plain.predict_sentiment(batch["input_ids"], batch["attention_mask"]))
    weights = dict(other.named_parameters())
    inputs = ("sst", {key: batch[key] for key in ("input_ids", "attention_mask")})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        anchored = torch.func.functional_call(model, weights, inputs)
        expected = torch.func.functional_call(plain, weights, inputs)
    assert torch.equal(anchored, expected)


def test_adamw_rewrites_the_copies_of_the_parameters_it_updates():
    updated, untouched = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))
    copies = {p: p.detach().to(torch.bfloat16) for p in (updated, untouched)}
    before = copies[untouched].clone()
    optimizer = AdamW([updated, untouched], lr=0.1, weight_decay=0.01)
    optimizer.keep_copies(copies)
    updated.grad = torch.randn(3, 4)
    optimizer.step()
    assert torch.equal(copies[updated], updated.detach().to(torch.bfloat16))
    assert torch.equal(copies[untouched], before)


def test_keep_bf16_copies_leaves_the_state_dict_as_it_was():
    model = tiny_model(0)
    names = {name: p.dtype for name, p in model.state_dict().items()}
    keep_bf16_copies([model], build_optimizer(model, 1e-3))
    assert {name: p.dtype for name, p in model.state_dict().items()} == names


@pytest.mark.parametrize("flags, problem", [
    ((), "--bf16_weights needs --precision bf16"),
    (("--precision", "fp32"), "--bf16_weights needs --precision bf16"),
    (("--precision", "bf16", "--compile"), "--bf16_weights does not combine with --compile"),
])
def test_bf16_weights_without_bf16_autocast_is_refused(flags, problem, capsys, model_must_not_load):
    assert exit_code(["--demo", "--bf16_weights", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert problem in error and len(error.splitlines()) == 1


def test_a_run_with_the_copies_saves_the_float32_weights_of_one_without(tiny_checkpoint, tmp_path, monkeypatch):
    skip_figures(monkeypatch)
    saved = {}
    for name, extra in (("casts", ()), ("copies", ("--bf16_weights",))):
        out = tmp_path / name
        assert mc.main(["--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune",
                        "--quiet", "--max_train_examples", "16", "--max_length", "32", "--batch_size", "4",
                        "--first_stages", "sst,sts", "--cycles", "0", "--precision", "bf16",
                        "--output_dir", str(out / "run"), *prediction_flags(out), *extra]) == 0
        saved[name] = load_file(str(out / "run" / "best.safetensors"))
    assert {tensor.dtype for tensor in saved["copies"].values()} == {torch.float32}
    assert saved["copies"].keys() == saved["casts"].keys()
    assert all(torch.equal(saved["copies"][name], saved["casts"][name]) for name in saved["casts"])
