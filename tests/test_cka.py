"""Linear CKA (minbert/reports/cka.py) against hand-computed values, its invariances and the Gram-matrix form it
equals; the per-layer sentence representations it compares; where each stage of a run began (stage_starts,
checked against the trainer's own choice); and scripts/stage_cka.py on a tiny run's --keep_stage_models."""
import json

import numpy as np
import pytest
import stage_cka
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_thesis_options import score_stages, weights_at_each_stage_start
from test_trainer import make_trainer

import multitask_classifier
from conftest import DEMO, demo_examples, prediction_flags, tiny_bert
from minbert.data.batches import collate_sentences
from minbert.model.multitask_bert import MultitaskBERT, trained_tensors
from minbert.model.readout import mean_pool
from minbert.reports.cka import (cka_by_layer, cka_matrices, dev_sentences, layer_representations, linear_cka,
                                 sentence_spans, with_start)
from minbert.training.schedules import Stage, StageKind
from minbert.training.stage_transitions import stage_starts

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------
# linear CKA


def test_linear_cka_of_hand_computed_examples():
    # one feature each: centred x = (-1, 0, 1), y = (0, -1, 1); <x, y>^2 / (|x|^2 |y|^2) = 1 / 4 = Pearson's r^2
    assert linear_cka([[1.0], [2.0], [3.0]], [[1.0], [0.0], [2.0]]) == pytest.approx(0.25, abs=1e-12)
    # X^T X = 2 I (Frobenius 2 sqrt 2), Y = X's first column: Y^T Y = 2, Y^T X = (2, 0): 4 / (2 sqrt 2 * 2)
    x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    assert linear_cka(x, x[:, :1]) == pytest.approx(1 / np.sqrt(2), abs=1e-12)
    assert linear_cka(x, x[:, 1:]) == pytest.approx(1 / np.sqrt(2), abs=1e-12)
    assert linear_cka(x[:, :1], x[:, 1:]) == pytest.approx(0.0, abs=1e-12)  # orthogonal features share nothing


def gram_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al.'s definition: HSIC of the linear kernels K = X X^T, L = Y Y^T with H the centring matrix,
    normalised: tr(KHLH) / sqrt(tr(KHKH) tr(LHLH))."""
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = h @ x @ x.T @ h, h @ y @ y.T @ h
    return float(np.trace(k @ l) / np.sqrt(np.trace(k @ k) * np.trace(l @ l)))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(3, 40), width_x=st.integers(1, 12), width_y=st.integers(1, 12),
       scale=st.floats(1e-3, 1e3))
def test_linear_cka_is_the_normalised_hsic_and_keeps_its_invariances(seed, n, width_x, width_y, scale):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, width_x)), rng.normal(size=(n, width_y))
    value = linear_cka(x, y)
    assert value == pytest.approx(gram_cka(x, y), abs=1e-9)
    assert -1e-12 <= value <= 1 + 1e-12
    assert linear_cka(y, x) == pytest.approx(value, abs=1e-12)
    rotation = np.linalg.qr(rng.normal(size=(width_x, width_x)))[0]  # orthogonal
    moved = scale * x @ rotation + rng.normal(size=width_x)  # rotated, scaled isotropically and translated
    assert linear_cka(moved, y) == pytest.approx(value, abs=1e-9)
    assert linear_cka(moved, x) == pytest.approx(1.0, abs=1e-9)


def test_linear_cka_changes_under_a_non_isotropic_scaling():
    """Kornblith et al.: linear CKA is not invariant to every invertible linear map (stretching one axis)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 3)), rng.normal(size=(30, 3))
    assert abs(linear_cka(x * [1.0, 1.0, 20.0], y) - linear_cka(x, y)) > 1e-3
    assert linear_cka(x * [1.0, 1.0, 20.0], x) < 0.99


def test_linear_cka_refuses_what_it_cannot_compare():
    with pytest.raises(ValueError, match="same for every input"):
        linear_cka(np.ones((5, 3)), np.arange(10.0).reshape(5, 2))
    with pytest.raises(ValueError, match="same N inputs"):
        linear_cka(np.zeros((5, 3)), np.zeros((4, 3)))


# ---------------------------------------------------------------------------------------------------
# The representations and the matrices


def test_layer_representations_are_each_layers_mean_pooled_tokens_in_file_order(tokenizer):
    model = MultitaskBERT(tiny_bert()).eval()
    sentences = {"sst": demo_examples("sst", "dev", 7), "qqp": dev_sentences(DEMO, ["qqp"], 5)["qqp"]}
    arrays = layer_representations(model, sentences, tokenizer, torch.device("cpu"), batch_size=3)
    assert arrays.shape == (model.bert.config.num_hidden_layers + 1, 12, model.bert.config.hidden_size)
    for rows, examples in ((slice(0, 7), sentences["sst"]), (slice(7, 12), sentences["qqp"])):
        batch = collate_sentences(examples, tokenizer, 128)
        with torch.no_grad():
            last = model.encode_sentences(batch["input_ids"], batch["attention_mask"])  # what the SBERT heads read
            first = mean_pool(model.bert.embed(batch["input_ids"]), batch["attention_mask"])
        np.testing.assert_allclose(arrays[-1, rows], last.numpy(), atol=1e-5)
        np.testing.assert_allclose(arrays[0, rows], first.numpy(), atol=1e-5)


def test_dev_sentences_take_a_pairs_first_sentence():
    sample = dev_sentences(DEMO, ["sst", "qqp"], 3)
    pairs = demo_examples("qqp", "dev", 3)
    assert [e.sentence for e in sample["qqp"]] == [p.sentence1 for p in pairs]
    assert sample["sst"] == demo_examples("sst", "dev", 3)


def test_the_matrices_hold_every_pair_and_each_stage_against_its_start():
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=(3, 10, 4)) for _ in range(3)]
    arrays.append(arrays[1] * 2.0)  # model 3: model 1 scaled, CKA 1 at every layer
    spans = sentence_spans({"a": range(6), "b": range(4)})
    assert spans == {"all": slice(0, 10), "a": slice(0, 6), "b": slice(6, 10)}
    matrices = cka_matrices(arrays, spans)
    assert matrices["all"].shape == (3, 4, 4)
    np.testing.assert_allclose(matrices["all"][:, 1, 3], 1.0)
    np.testing.assert_allclose(matrices["b"][:, 0, 2], cka_by_layer(arrays[0][:, 6:], arrays[2][:, 6:]))
    np.testing.assert_allclose(matrices["all"], matrices["all"].transpose(0, 2, 1))
    starts = [None, 0, 1, 1]  # model 3 began from model 1, not from model 2
    np.testing.assert_allclose(with_start(matrices["all"], starts),
                               [matrices["all"][:, 1, 0], matrices["all"][:, 2, 1], np.ones(3)])


# ---------------------------------------------------------------------------------------------------
# Where each stage began


def records(*labels_and_scores) -> list[dict]:
    return [{"stage": "pretrained"}] + [{"stage": label, "index": i + 1, "score": score}
                                        for i, (label, score) in enumerate(labels_and_scores)]


def test_stage_starts_read_the_block_before_from_the_history(monkeypatch):
    score_stages(monkeypatch, lambda record, tasks: record["score"])
    history = records(("qqp", 0.5), ("sts", 0.9), ("sts", 0.4), ("sst", 0.1), ("sst", 0.7), ("qqp@0.03", 0.2))
    assert stage_starts(history, "best") == [None, 0, 1, 2, 2, 4, 5]  # after STS from its first epoch (stage 2)
    assert stage_starts(history, "last") == [None, 0, 1, 2, 3, 4, 5]
    ties = records(("sts", 0.5), ("sts", 0.5), ("sst", 0.1))
    assert stage_starts(ties, "best") == [None, 0, 1, 1]  # the first of equal scores, as the trainer keeps it
    simcse = records(("simcse", 0.8), ("simcse", 0.2), ("sst", 0.1), ("mlm", 0.9), ("mlm", 0.1), ("sst", 0.3))
    assert stage_starts(simcse, "last", simcse_keep="best") == [None, 0, 1, 1, 3, 4, 5]  # mlm blocks go on
    assert stage_starts(simcse, "best", simcse_keep="last") == [None, 0, 1, 2, 3, 4, 5]


def test_stage_starts_agree_with_the_weights_the_trainer_started_each_stage_from(tmp_path, tokenizer, monkeypatch):
    sst, qqp, sts = (Stage(StageKind.TASK, task) for task in ("sst", "qqp", "sts"))
    scores = {1: 0.2, 2: 0.9, 3: 0.1, 4: 0.5, 5: 0.6, 6: 0.3}  # the first STS epoch and the second SST epoch best
    score_stages(monkeypatch, lambda record, tasks: scores.get(record["index"], 0.0))
    trainer = make_trainer(tmp_path, tokenizer, stage_start="best")
    starts = weights_at_each_stage_start(trainer, monkeypatch)
    ends, run_stage = [{k: v.clone() for k, v in trained_tensors(trainer.model).items()}], trainer.run_stage

    def recording(index, stage):
        loss = run_stage(index, stage)
        ends.append({k: v.clone() for k, v in trained_tensors(trainer.model).items()})
        return loss
    monkeypatch.setattr(trainer, "run_stage", recording)
    trainer.train([qqp, sts, sts, sst, sst, qqp])
    began = stage_starts(trainer.state.history, "best")
    assert began == [None, 0, 1, 2, 2, 4, 5]
    for stage in range(1, 7):
        assert all(torch.equal(starts[stage - 1][k], ends[began[stage]][k]) for k in ends[0]), stage


# ---------------------------------------------------------------------------------------------------
# scripts/stage_cka.py


def test_the_script_compares_each_kept_stage_with_its_start(tiny_checkpoint, tmp_path, no_plots):
    flags = ["--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
             "--batch_size", "8", "--max_length", "32", "--max_train_examples", "16", "--first_stages", "sts*2,sst",
             "--cycles", "0", "--stage_start", "best", "--keep_stage_models", "--output_dir", str(tmp_path / "run")]
    assert multitask_classifier.main(flags + prediction_flags(tmp_path)) == 0
    run, out = tmp_path / "run", tmp_path / "cka"
    history = json.loads((run / "history.json").read_text())
    assert stage_cka.main([str(run), str(run), "--names", "a,b", "--data_dir", str(DEMO), "--per_task", "6",
                           "--output_dir", str(out)]) == 0
    result = json.loads((out / "a.json").read_text())
    assert result["started_from"] == stage_starts(history, "best")
    assert result["models"] == [str(tiny_checkpoint), "stage 1 (sts)", "stage 2 (sts)", "stage 3 (sst)"]
    assert result["sentences"] == {"sst": 6, "qqp": 6, "sts": 6}
    assert len(result["layers"]) == 3 and len(result["with_start"]["all"]) == 3  # the tiny model: 2 layers
    matrix = np.array(result["matrices"]["all"])
    for stage, start in enumerate(result["started_from"][1:]):
        np.testing.assert_allclose(result["with_start"]["qqp"][stage], np.array(result["matrices"]["qqp"])[:, stage + 1, start])
    assert matrix.shape == (3, 4, 4) and np.all((matrix > 0) & (matrix <= 1))
    assert all((out / name).stat().st_size > 0 for name in ("a.png", "b.png", "compare.png", "compare_by_task.png"))
    panels = stage_cka.comparison_curves({"a": result})
    assert list(panels) == [f"{model} vs its start" for model in result["models"][1:]] + \
        ["last stage vs stage 1", "last stage vs pretrained"]
    np.testing.assert_allclose(panels["last stage vs stage 1"]["a"], matrix[:, 3, 1])


def test_the_script_refuses_a_run_without_stage_models_in_one_line(tmp_path, capsys):
    assert stage_cka.main([str(tmp_path), "--data_dir", str(DEMO), "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {tmp_path}: no stage_N checkpoints (train the run with --keep_stage_models)"
    (tmp_path / "stage_1.json").write_text("{}")
    assert stage_cka.main([str(tmp_path), "--data_dir", str(DEMO), "--output_dir", str(tmp_path / "out")]) == 2
    assert "not a stage checkpoint's metadata" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        stage_cka.main([str(tmp_path), str(tmp_path), "--names", "one", "--output_dir", str(tmp_path / "out")])
    assert refused.value.code == 2 and "--names: give 2 different names" in capsys.readouterr().err


def test_the_script_never_replaces_a_runs_files_nor_writes_outside_its_folder(tiny_checkpoint, tmp_path, capsys):
    """Audit: --names best,stage_1 --output_dir RUN1 replaced RUN1's best.json and stage_1.json with CKA results;
    --names ../evil,b wrote OUTPUT_DIR/../evil.json; --batch_size 0 and --tasks , failed after loading, not naming
    the flag. Each is one line, exit 2, before any model or data loads."""
    from conftest import tiny_model
    from minbert.model.multitask_bert import save_multitask_model
    runs = [tmp_path / "run1", tmp_path / "run2"]
    for run in runs:
        for prefix in ("best", "stage_1"):
            save_multitask_model(tiny_model(), run / prefix, {"args": {"pretrained": str(tiny_checkpoint)},
                                                              "metrics": {"stage": "sts", "index": 1}})
    before = {path: path.read_bytes() for run in runs for path in run.iterdir()}
    pretrained = {path: path.read_bytes() for path in tiny_checkpoint.iterdir()}
    both = [*map(str, runs), "--data_dir", str(DEMO)]
    for names, output_dir, problem in (("best,stage_1", runs[0], "would replace a file of the run"),
                                       ("a,history", runs[1], "would replace a file of the run"),
                                       ("config,b", tiny_checkpoint, "which this command reads")):
        assert stage_cka.main([*both, "--names", names, "--output_dir", str(output_dir)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --output_dir ") and problem in err[0], err
    for flags, problem in ((["--names", "../evil,b"], "--names: '../evil' is not a plain file name"),
                           (["--names", "a,compare"], "--names: 'compare' names a figure of the comparison"),
                           (["--batch_size", "0"], "--batch_size must be >= 1, got 0"),
                           (["--tasks", ","], "--tasks: name at least one of")):
        with pytest.raises(SystemExit) as refused:
            stage_cka.main([*both, *flags, "--output_dir", str(tmp_path / "out" / "d")])
        err = capsys.readouterr().err.strip().splitlines()
        assert refused.value.code == 2 and len(err) == 1 and problem in err[0], err
    assert not (tmp_path / "out").exists() and not (tmp_path / "history.json").exists()
    assert {path: path.read_bytes() for run in runs for path in run.iterdir()} == before
    assert {path: path.read_bytes() for path in tiny_checkpoint.iterdir()} == pretrained


def test_the_script_refuses_stage_models_of_another_run_naming_the_file(tiny_checkpoint, tmp_path, capsys,
                                                                        monkeypatch):
    """Audit: the run's settings were read from stage_1.json alone, so another run's stage_2.* copied into the
    folder, or an earlier run's stage files beside a run trained there since, gave a CKA mixing runs (exit 0). Every
    stage_N.json and best.json must record one run's settings (and stage_N.json stage N's record): one line naming
    the file, exit 2, before any model loads or anything is written."""
    import shutil
    from conftest import tiny_model
    from minbert.model.multitask_bert import save_multitask_model

    def train(run, seed, stages=2):
        settings = {"pretrained": str(tiny_checkpoint), "seed": seed, "output_dir": str(run)}
        for index in range(1, stages + 1):
            saved = {"args": settings, "metrics": {"stage": "sts", "index": index}}
            save_multitask_model(tiny_model(), run / f"stage_{index}", saved)
        save_multitask_model(tiny_model(), run / "best", {"args": settings, "metrics": {"stage": "sts", "index": 1}})
    runs = {name: tmp_path / name for name in ("copied", "retrained", "renamed", "other", "moved")}
    for name, run in runs.items():
        train(run, seed=0)
    train(runs["other"], seed=1)
    train(runs["retrained"], seed=1, stages=0)  # its folder trained again since: only best.* (no stage models)
    for suffix in ("json", "safetensors"):
        shutil.copy(runs["other"] / f"stage_2.{suffix}", runs["copied"] / f"stage_2.{suffix}")
        shutil.copy(runs["other"] / f"stage_1.{suffix}", runs["renamed"] / f"stage_2.{suffix}")
        shutil.copy(runs["other"] / f"stage_2.{suffix}", runs["moved"] / f"stage_2.{suffix}")
    moved = json.loads((runs["moved"] / "stage_2.json").read_text())  # the same seed, another folder's run
    moved["args"]["seed"] = 0
    (runs["moved"] / "stage_2.json").write_text(json.dumps(moved))

    def loading(*_args, **_kwargs):
        raise AssertionError("a model loaded before the stage checkpoints were checked")
    monkeypatch.setattr(stage_cka, "load_multitask_checkpoint", loading)
    monkeypatch.setattr(stage_cka.BertModel, "from_pretrained", loading)
    for name, file, problem in (("copied", "stage_2.json", "another run's checkpoint (its --output_dir"),
                                ("retrained", "best.json", "another run's checkpoint (its --seed 1 is 0 in"),
                                ("renamed", "stage_2.json", "holds stage 1's model, not stage 2's"),
                                ("moved", "stage_2.json", "another run's checkpoint (its --output_dir")):
        out = tmp_path / "out" / name
        assert stage_cka.main([str(runs[name]), "--data_dir", str(DEMO), "--output_dir", str(out)]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {runs[name] / file}: ") and problem in err[0], err
        assert not out.exists()
    (runs["other"] / "best.json").unlink()
    assert stage_cka.main([str(runs["other"]), "--data_dir", str(DEMO), "--output_dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {runs['other'] / 'best.json'}: cannot read it")
