"""adapters.py: LoRA and DoRA against peft (the oracle), fused-QKV slices against separate Q / V adapters,
PALs, merging, per-task routing."""
import pytest
import torch
from torch import nn

from conftest import TINY, hf_state_dict, tiny_bert
from minbert.model.adapters import AdaptedLinear, AdapterConfig, activate, add_adapters, merge_adapters

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_thread")


def random_batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 2000, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return ids * mask, mask


def randomise_adapters(model: nn.Module, seed: int = 1) -> None:
    """Non-zero B (and magnitudes off the base norms), so that the adapters really change the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name or "magnitude" in name or "pals." in name:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def adapted_bert(kind: str, targets=("query", "value"), rank=4, alpha=8.0):
    bert = tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()
    add_adapters(bert, AdapterConfig(kind, rank, alpha, targets=targets), ["sst"])
    return bert


# Our target -> (our module inside a BertLayer, the Hugging Face module inside a BertLayer).
MODULES = {"query": ("attention.qkv", "attention.self.query"), "key": ("attention.qkv", "attention.self.key"),
           "value": ("attention.qkv", "attention.self.value"),
           "attention_output": ("attention.out_proj", "attention.output.dense"),
           "ffn_in": ("ffn_in", "intermediate.dense"), "ffn_out": ("ffn_out", "output.dense")}


def peft_copy(bert, kind: str, targets, rank=4, alpha=8.0):
    """The same model in transformers + peft, every adapter weight copied from ours."""
    reference = transformers.BertModel(transformers.BertConfig(
        **TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    plain = type(bert)(bert.config)
    plain.load_state_dict({k.replace(".base_layer.", "."): v for k, v in bert.state_dict().items()
                           if ".adapters." not in k})
    reference.load_state_dict(hf_state_dict(plain), strict=False)
    pattern = r".*\.layer\.\d+\.(" + "|".join(MODULES[t][1].replace(".", r"\.") for t in targets) + ")$"
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=pattern,
                             use_dora=kind == "dora")
    reference = peft.get_peft_model(reference, config).eval()
    with torch.no_grad():
        for i, layer in enumerate(bert.encoder.layers):
            for target in targets:
                update = layer.get_submodule(MODULES[target][0]).adapters["sst"][target]
                theirs = reference.base_model.model.encoder.layer[i].get_submodule(MODULES[target][1])
                theirs.lora_A["default"].weight.copy_(update.lora_A)
                theirs.lora_B["default"].weight.copy_(update.lora_B)
                if kind == "dora":
                    theirs.lora_magnitude_vector["default"].weight.copy_(update.magnitude)
    return reference


@pytest.mark.parametrize("kind", ["lora", "dora"])
@pytest.mark.parametrize("targets", [("query", "value"), ("key", "attention_output", "ffn_in", "ffn_out")])
def test_adapters_equal_peft_on_transformers(kind, targets):
    bert = adapted_bert(kind, targets)
    randomise_adapters(bert)
    reference = peft_copy(bert, kind, targets)
    ids, mask = random_batch()
    activate(bert, "sst")
    mine = bert(ids, mask)["last_hidden_state"]
    theirs = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert (mine[real] - theirs[real]).abs().max() < 1e-5
    # The gradients too (the adapted rows are written into the base output in place).
    (mine[real] ** 2).sum().backward()
    (theirs[real] ** 2).sum().backward()
    target = targets[0]
    update = bert.encoder.layers[0].get_submodule(MODULES[target][0]).adapters["sst"][target]
    peft_layer = reference.base_model.model.encoder.layer[0].get_submodule(MODULES[target][1])
    torch.testing.assert_close(update.lora_A.grad, peft_layer.lora_A["default"].weight.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(update.lora_B.grad, peft_layer.lora_B["default"].weight.grad, atol=1e-5, rtol=1e-4)
    if kind == "dora":
        torch.testing.assert_close(update.magnitude.grad, peft_layer.lora_magnitude_vector["default"].weight.grad,
                                   atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["lora", "dora", "pals"])
def test_fresh_adapters_reproduce_the_base_model_exactly(kind):
    base = tiny_bert().eval()
    bert = tiny_bert().eval()
    owner = add_adapters(bert, AdapterConfig(kind, targets=tuple(MODULES)), ["sst", "qqp"])
    ids, mask = random_batch()
    activate(owner or bert, "qqp")
    with torch.no_grad():
        assert torch.equal(bert(ids, mask)["last_hidden_state"], base(ids, mask)["last_hidden_state"])


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_a_merged_adapter_gives_the_adapted_outputs(kind):
    bert = adapted_bert(kind, tuple(MODULES))
    randomise_adapters(bert)
    merged = merge_adapters(bert, "sst").eval()
    assert not any(".adapters." in k or "base_layer" in k for k in merged.state_dict())
    ids, mask = random_batch()
    activate(bert, "sst")
    with torch.no_grad():
        torch.testing.assert_close(merged(ids, mask)["last_hidden_state"], bert(ids, mask)["last_hidden_state"],
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_fused_qkv_slices_equal_separate_query_and_value_adapters(kind):
    torch.manual_seed(0)
    hidden = 8
    fused = nn.Linear(hidden, 3 * hidden)
    config = AdapterConfig(kind, rank=2, alpha=4.0, targets=("query", "value"))
    sliced = AdaptedLinear(fused, {"query": slice(0, hidden), "value": slice(2 * hidden, 3 * hidden)}, config, ["t"])
    randomise_adapters(sliced)
    separate = []
    for index, target in enumerate(("query", "key", "value")):
        part = nn.Linear(hidden, hidden)
        with torch.no_grad():
            part.weight.copy_(fused.weight[index * hidden:(index + 1) * hidden])
            part.bias.copy_(fused.bias[index * hidden:(index + 1) * hidden])
        if target != "key":
            part = AdaptedLinear(part, {target: slice(0, hidden)}, config, ["t"])
            part.adapters["t"][target].load_state_dict(sliced.adapters["t"][target].state_dict())
            part.active = "t"
        separate.append(part)
    sliced.active = "t"
    x = torch.randn(5, hidden)
    torch.testing.assert_close(sliced(x), torch.cat([part(x) for part in separate], dim=-1))


def test_each_task_runs_its_own_adapters_and_none_runs_the_base():
    bert = adapted_bert("lora")
    randomise_adapters(bert)
    ids, mask = random_batch()
    with torch.no_grad():
        activate(bert, None)
        plain = bert(ids, mask)["last_hidden_state"]
        activate(bert, "sst")
        adapted = bert(ids, mask)["last_hidden_state"]
    assert not torch.allclose(plain, adapted)
    torch.testing.assert_close(plain, tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()(
        ids, mask)["last_hidden_state"], rtol=0, atol=0)


def test_pals_run_beside_every_layer_and_cannot_be_merged():
    bert = tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()
    pals = add_adapters(bert, AdapterConfig("pals", pal_size=8), ["sst", "sts"])
    holder = nn.ModuleDict({"bert": bert, "pals": pals})
    assert set(pals.sets) == {"sst", "sts"}
    assert all(layer.parallel is not None for layer in bert.encoder.layers)
    assert not any("pals" in k for k in bert.state_dict())  # the layers hold a hook, not the weights
    randomise_adapters(holder)
    ids, mask = random_batch()
    with torch.no_grad():
        activate(holder, "sst")
        sst = bert(ids, mask)["last_hidden_state"]
        activate(holder, "sts")
        sts = bert(ids, mask)["last_hidden_state"]
    assert not torch.allclose(sst, sts)
    assert pals.sets["sst"].encoder.weight.shape == (8, TINY["hidden_size"])
    with pytest.raises(ValueError, match="cannot be merged"):
        merge_adapters(bert, "sst")


def test_pal_size_follows_the_model():
    bert = tiny_bert()  # hidden 32, 2 heads: 32 * 204 / 768 = 8.5 -> 8
    assert add_adapters(bert, AdapterConfig("pals"), ["sst"]).sets["sst"].encoder.out_features == 8


@pytest.mark.parametrize("settings, problem", [(dict(kind="adapterfusion"), "adapter must be one of"),
                                                (dict(rank=0), "rank must be >= 1"),
                                                (dict(targets=("query", "gate")), "targets must be some of"),
                                                (dict(sharing="some"), "sharing must be one of")])
def test_bad_adapter_settings_are_value_errors(settings, problem):
    with pytest.raises(ValueError, match=problem):
        AdapterConfig(**settings)


# --- adapters in MultitaskBERT: forgetting, checkpoints, the Bregman anchor -------------------------

def adapted_multitask(kind="lora", sharing="per_task"):
    from minbert.model.multitask_bert import MultitaskBERT, freeze_encoder
    model = MultitaskBERT(tiny_bert(), adapter=AdapterConfig(kind, rank=4, sharing=sharing))
    freeze_encoder(model)
    return model


@pytest.mark.parametrize("kind", ["lora", "dora", "pals"])
def test_training_one_task_leaves_another_tasks_outputs_bit_identical(kind, tokenizer):
    from conftest import pair_batch, sentence_batch
    from minbert.training.objective import compute_task_loss
    from optimizer import AdamW
    model = adapted_multitask(kind)
    randomise_adapters(model)
    sentences, pairs = sentence_batch(tokenizer, 4), pair_batch(tokenizer, "sts", 4)
    model.eval()
    with torch.no_grad():
        sst_before, sts_before = model("sst", sentences), model("sts", pairs)
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    compute_task_loss(model, "qqp", pair_batch(tokenizer, "qqp", 4))[0].backward()
    optimizer.step()
    model.eval()
    with torch.no_grad():
        assert torch.equal(model("sst", sentences), sst_before)
        assert torch.equal(model("sts", pairs), sts_before)
    trained = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert trained and all("qqp" in n or n.startswith("paraphrase_head.") for n in trained)


def test_adapters_switch_only_by_set_adapter_and_a_forgotten_switch_is_refused(tokenizer):
    from conftest import pair_batch, sentence_batch
    model = adapted_multitask().eval()
    randomise_adapters(model)
    sentences = sentence_batch(tokenizer, 3)
    inputs = model.encoder_inputs("sst", sentences)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=r"no task's adapters: call set_adapter\('sst'\)"):
            model.outputs_from_embeddings("sst", model.embed(inputs), inputs)
        expected = model("sst", sentences)  # forward sets its task's adapters itself
        model.encoder_inputs("qqp", pair_batch(tokenizer, "qqp", 3))  # no side effect
        assert torch.equal(model.outputs_from_embeddings("sst", model.embed(inputs), inputs), expected)
        model.set_adapter("qqp")
        with pytest.raises(RuntimeError, match="made with qqp's adapters"):
            model.outputs_from_embeddings("sst", model.embed(inputs), inputs)
        assert torch.equal(model("sst", sentences), expected)


def test_shared_adapters_are_shared_and_per_task_ones_are_not():
    per_task, shared = adapted_multitask(), adapted_multitask(sharing="shared")
    name = "bert.encoder.layers.0.attention.qkv.adapters.{}.query.lora_A"
    assert not per_task.is_shared(name.format("sst")) and shared.is_shared(name.format("shared"))
    assert per_task.is_shared("bert.encoder.layers.0.attention.qkv.base_layer.weight")
    assert not adapted_multitask("pals").is_shared("pals.sets.sts.encoder.weight")


def test_an_adapter_checkpoint_holds_only_what_trained_and_round_trips(tmp_path, tiny_checkpoint, tokenizer):
    from bert import BertModel
    from conftest import pair_batch
    from minbert.model.multitask_bert import MultitaskBERT, freeze_encoder, load_multitask_model, save_multitask_model
    model = MultitaskBERT(BertModel.from_pretrained(str(tiny_checkpoint)), adapter=AdapterConfig("dora", rank=2))
    freeze_encoder(model)
    randomise_adapters(model)
    save_multitask_model(model, tmp_path / "adapters", {})
    full = MultitaskBERT(BertModel.from_pretrained(str(tiny_checkpoint)))
    save_multitask_model(full, tmp_path / "full", {})
    small, large = ((tmp_path / f"{n}.safetensors").stat().st_size for n in ("adapters", "full"))
    assert small < 0.1 * large
    loaded = load_multitask_model(tmp_path / "adapters").eval()
    batch = pair_batch(tokenizer, "qqp", 3)
    with torch.no_grad():
        assert torch.equal(loaded("qqp", batch), model.eval()("qqp", batch))
    assert not any(p.requires_grad for n, p in loaded.bert.named_parameters() if ".adapters." not in n)


def test_an_adapter_checkpoint_refuses_a_base_with_other_weights(tmp_path, tiny_checkpoint):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from base_bert import CheckpointError
    from bert import BertModel
    from minbert.model.multitask_bert import MultitaskBERT, freeze_encoder, load_multitask_model, save_multitask_model
    base = tmp_path / "base"
    shutil.copytree(tiny_checkpoint, base)
    model = MultitaskBERT(BertModel.from_pretrained(str(base)), adapter=AdapterConfig("lora"))
    freeze_encoder(model)
    save_multitask_model(model, tmp_path / "adapters", {})
    assert json.loads((tmp_path / "adapters.json").read_text())["base"]["pretrained"] == str(base)
    weights = load_file(str(base / "model.safetensors"))
    weights["embeddings.word_embeddings.weight"][5] += 1.0
    save_file(weights, str(base / "model.safetensors"))
    with pytest.raises(CheckpointError, match="other base weights"):
        load_multitask_model(tmp_path / "adapters")


def test_the_bregman_anchor_copies_only_trainable_parameters():
    from smart import BregmanAnchor
    model = adapted_multitask()
    anchor = BregmanAnchor(model, 0.99)
    assert set(anchor.params) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any(n.startswith("bert.") and ".adapters." not in n for n in anchor.params)
