"""scripts/export_hf.py against the oracles: transformers and sentence-transformers load the exported
encoder and give this project's hidden states and sentence embeddings; the export loads back here too."""
import json

import pytest
import torch

import export_hf
from adapters import AdapterConfig
from bert import BertModel
from multitask_bert import MultitaskBERT, freeze_encoder, save_multitask_model

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SENTENCES = ["A man is playing a guitar.", "The cat sat on the mat, and then it slept for hours."]


def trained_checkpoint(tmp_path, tiny_checkpoint, pooling="mean", adapter=None):
    model = MultitaskBERT(BertModel.from_pretrained(str(tiny_checkpoint)), pooling=pooling, adapter=adapter)
    if adapter is not None:
        freeze_encoder(model)
    with torch.no_grad():  # move every weight off its pretrained value, as training would
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                parameter.add_(0.01 * torch.randn_like(parameter))
    save_multitask_model(model, tmp_path / "best", {"args": {"pretrained": str(tiny_checkpoint), "max_length": 32}})
    return model.eval()


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_export_loads_in_transformers_sentence_transformers_and_back_here(tmp_path, tiny_checkpoint, tokenizer,
                                                                         pooling):
    model = trained_checkpoint(tmp_path, tiny_checkpoint, pooling)
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out")]) == 0
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ours = model.bert(batch["input_ids"], batch["attention_mask"])["last_hidden_state"]
        theirs = transformers.BertModel.from_pretrained(str(tmp_path / "out")).eval()(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        assert (ours[real] - theirs[real]).abs().max() < 1e-5
        again = BertModel.from_pretrained(str(tmp_path / "out")).eval()(batch["input_ids"], batch["attention_mask"])
        assert torch.equal(again["last_hidden_state"], ours)
        embeddings = model.encode_sentences(batch["input_ids"], batch["attention_mask"])
    sentence_transformers = pytest.importorskip("sentence_transformers")
    encoded = sentence_transformers.SentenceTransformer(str(tmp_path / "out"), device="cpu").encode(
        SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(encoded, embeddings, atol=1e-5, rtol=1e-4)
    heads = json.loads((tmp_path / "out" / "heads.json").read_text())
    assert heads["pooling"] == pooling


def test_per_task_adapters_export_merged_for_the_task_given(tmp_path, tiny_checkpoint, tokenizer, capsys):
    from adapters import activate
    model = trained_checkpoint(tmp_path, tiny_checkpoint, adapter=AdapterConfig("lora", rank=2))
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out")]) == 2
    assert "choose one with --task" in capsys.readouterr().err
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out"), "--task", "sts"]) == 0
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    activate(model, "sts")
    with torch.no_grad():
        ours = model.bert(batch["input_ids"], batch["attention_mask"])["last_hidden_state"]
        exported = BertModel.from_pretrained(str(tmp_path / "out")).eval()(batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(exported["last_hidden_state"][real], ours[real], atol=1e-5, rtol=1e-5)


# -- what cannot be exported is refused before anything is written (issue 39) ------------------------------


def test_a_training_state_is_refused_as_not_a_model(tmp_path, tiny_checkpoint, capsys):
    from checkpoint import atomic_save
    atomic_save(tmp_path / "last", {"model.w": torch.zeros(1), "optimizer.0.exp_avg": torch.zeros(1)},
                {"next_stage": 1, "bert_config": {}, "heads": {}})
    assert export_hf.main([str(tmp_path / "last"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "a run's training state, which --resume continues" in err and "OUTPUT_DIR/best" in err
    assert "\n" not in err and not (tmp_path / "out").exists()


def test_a_missing_pretrained_folder_leaves_no_half_export(tmp_path, tiny_checkpoint, capsys):
    import shutil
    source = tmp_path / "pretrained"
    shutil.copytree(tiny_checkpoint, source)
    trained_checkpoint(tmp_path, source)
    shutil.rmtree(source)  # the checkpoint names a pretrained folder that is gone
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_export_folder_that_is_a_file_is_refused(tmp_path, tiny_checkpoint, capsys):
    trained_checkpoint(tmp_path, tiny_checkpoint)
    (tmp_path / "out").write_text("")
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out")]) == 2
    assert f"{tmp_path / 'out'} is a file, not a folder" in capsys.readouterr().err
