"""embedding_analysis.py and scripts/plot_embeddings.py: SST embeddings as the SST head reads them, the t-SNE
plots, and --keep_stage_models' per-stage checkpoints that the side-by-side plot compares."""

from contextlib import nullcontext

import numpy as np
import plot_embeddings
import pytest
import torch

import minbert.reports.embedding_analysis as embedding_analysis
import multitask_classifier
from conftest import DEMO, demo_examples, prediction_flags, tiny_bert
from minbert.data.batches import collate_sentences
from minbert.model.adapters import AdapterConfig
from minbert.model.multitask_bert import MultitaskBERT
from minbert.reports.embedding_analysis import SST_CLASS_NAMES, plot_tsne, sentence_embeddings, tsne_points
from minbert.reports.plots import save_figure

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


def test_tsne_keeps_well_separated_classes_apart():
    labels = np.arange(40) % 5
    centres = 20 * np.eye(5, 8)  # five classes far apart in 8-D, each a tight cloud
    embeddings = centres[labels] + np.random.default_rng(0).normal(size=(40, 8))
    points = tsne_points(embeddings)
    assert points.shape == (40, 2)
    assert all(labels[_nearest_other(points, i)] == labels[i] for i in range(40))  # every point beside its class
    with pytest.raises(ValueError, match="at least 5"):
        tsne_points(embeddings[:4])


def _nearest_other(points, index):
    distances = np.linalg.norm(points - points[index], axis=1)
    distances[index] = np.inf
    return int(np.argmin(distances))


def test_tsne_plot_has_a_panel_per_model_and_colours_each_point_by_its_class(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(5), [4, 5, 6, 7, 8]))  # unequal classes: a swapped one shows
    panels = {"before": rng.normal(size=(30, 8)), "after": 20 * np.eye(5, 8)[labels] + rng.normal(size=(30, 8))}
    figures = []

    def keep_figure(fig, path):
        figures.append(fig)
        return save_figure(fig, path)
    monkeypatch.setattr(embedding_analysis, "save_figure", keep_figure)
    path = plot_tsne(panels, labels, tmp_path / "t.png")
    assert path.read_bytes().startswith(b"\x89PNG")
    axes = figures[0].axes
    assert [ax.get_title() for ax in axes] == ["before", "after"]
    assert [text.get_text() for text in axes[-1].get_legend().get_texts()] == list(SST_CLASS_NAMES)
    for ax in axes:
        assert [len(scatter.get_offsets()) for scatter in ax.collections] == [4, 5, 6, 7, 8]  # a scatter per class
    plotted = np.concatenate([scatter.get_offsets() for scatter in axes[1].collections])
    plotted_labels = np.repeat(np.arange(5), [4, 5, 6, 7, 8])
    assert all(plotted_labels[_nearest_other(plotted, i)] == plotted_labels[i] for i in range(30))


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


def test_plot_refuses_to_replace_what_it_reads_and_a_bad_max_length(tiny_checkpoint, tmp_path, capsys,
                                                                     model_must_not_load):
    """Audit: --output onto the --data_dir's data file or the checkpoint's PREFIX.json replaced them (only PREFIX
    was compared); --max_length -5 was a traceback, 0 and 100000 (64 positions) ran. Each is one line, exit 2,
    before any model loads."""
    import shutil
    from conftest import tiny_model
    from minbert.model.multitask_bert import save_multitask_model
    data, run = tmp_path / "data", tmp_path / "run"
    shutil.copytree(DEMO, data)
    save_multitask_model(tiny_model(), run / "best", {"args": {"pretrained": str(tiny_checkpoint)}})
    (run / "history.json").write_text("[]")
    before = {path: path.read_bytes() for path in [*data.iterdir(), *run.iterdir()]}
    common = [str(run / "best"), "--data_dir", str(data)]
    for output in (data / "ids-sst-dev.csv", run / "best.json", run / "best.safetensors", run / "history.json",
                   run / "sst_tsne.png", tiny_checkpoint / "config.json"):
        assert plot_embeddings.main([*common, "--output", str(output)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --output {output}: "), err
    for length, problem in (("-5", "must be >= 3"), ("0", "must be >= 3"), ("100000", "longer than the 64 positions")):
        with pytest.raises(SystemExit) if length != "100000" else nullcontext() as refused:
            code = plot_embeddings.main([*common, "--output", str(tmp_path / "t.png"), "--max_length", length])
        code = refused.value.code if length != "100000" else code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--max_length" in err[0] and problem in err[0], err
    assert {path: path.read_bytes() for path in [*data.iterdir(), *run.iterdir()]} == before
