"""embedding_analysis.py and scripts/plot_embeddings.py: SST embeddings as the SST head reads them, the t-SNE
plots, and --keep_stage_models' per-stage checkpoints that the side-by-side plot compares."""

import numpy as np
import pytest
import torch

import multitask_classifier
import plot_embeddings
from adapters import AdapterConfig
from conftest import DEMO, demo_examples, prediction_flags, tiny_bert
from datasets import collate_sentences
from embedding_analysis import plot_tsne, sentence_embeddings, tsne_points
from multitask_bert import MultitaskBERT

pytestmark = pytest.mark.usefixtures("one_thread")


def test_embeddings_are_the_pooled_sentences_in_file_order(tokenizer):
    model = MultitaskBERT(tiny_bert()).eval()
    examples = demo_examples("sst", "dev", 9)
    embeddings = sentence_embeddings(model, "sst", examples, tokenizer, torch.device("cpu"), batch_size=4)
    batch = collate_sentences(examples, tokenizer, 128)
    with torch.no_grad():
        expected = model.encode_sentences(batch["input_ids"], batch["attention_mask"])
    np.testing.assert_allclose(embeddings, expected.numpy(), atol=1e-5)


def test_embeddings_go_through_the_tasks_own_adapter(tokenizer):
    model = MultitaskBERT(tiny_bert(), adapter=AdapterConfig("lora", rank=2)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name and ".sst." in name:
                parameter.fill_(0.5)  # only SST's adapter changes the encoder
    examples = demo_examples("sst", "dev", 6)
    sst, qqp = (sentence_embeddings(model, task, examples, tokenizer, torch.device("cpu")) for task in ("sst", "qqp"))
    assert not np.allclose(sst, qqp)
    plain = MultitaskBERT(tiny_bert()).eval()  # the same base weights (seed 0), no adapter
    np.testing.assert_allclose(qqp, sentence_embeddings(plain, "sst", examples, tokenizer, torch.device("cpu")),
                               atol=1e-5)


def test_tsne_plot_has_a_panel_per_model(tmp_path):
    generator = np.random.default_rng(0)
    labels = np.arange(30) % 5
    panels = {"a": generator.normal(size=(30, 8)), "b": generator.normal(size=(30, 8)) + labels[:, None]}
    path = plot_tsne(panels, labels, tmp_path / "t.png")
    assert path.stat().st_size > 0
    assert tsne_points(panels["a"]).shape == (30, 2)
    with pytest.raises(ValueError, match="at least 5"):
        tsne_points(panels["a"][:4])


def test_stage_models_are_kept_and_plotted_side_by_side(tiny_checkpoint, tmp_path, capsys):
    flags = ["--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
             "--batch_size", "8", "--max_length", "32", "--max_train_examples", "16", "--first_stages", "sts,sst",
             "--cycles", "0", "--keep_stage_models", "--output_dir", str(tmp_path / "run")]
    assert multitask_classifier.main(flags + prediction_flags(tmp_path)) == 0
    run = tmp_path / "run"
    assert (run / "sst_tsne.png").is_file()  # every run plots its best model
    assert all((run / f"stage_{n}.{suffix}").is_file() for n in (1, 2) for suffix in ("json", "safetensors"))
    output = tmp_path / "stages.png"
    assert plot_embeddings.main([str(run / "stage_1"), str(run / "stage_2"), "--data_dir", str(DEMO),
                                 "--output", str(output)]) == 0
    assert output.stat().st_size > 0 and f"wrote {output}" in capsys.readouterr().out
    assert plot_embeddings.main([str(run / "missing"), "--data_dir", str(tmp_path), "--output", str(output)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert plot_embeddings.main([str(run / "stage_1"), "--data_dir", str(DEMO), "--output", str(blocker / "t.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {blocker}: cannot write there, {blocker} is a file, not a folder"
