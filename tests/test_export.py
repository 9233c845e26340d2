"""scripts/export_hf.py against the oracles: transformers and sentence-transformers load the exported
encoder and give this project's hidden states and sentence embeddings; the export loads back here too.

The oracles run in a process of their own whose working directory is not the project and whose import path does
not hold it, as a user loads an export: the course's top-level datasets.py would shadow Hugging Face's `datasets`,
which sentence-transformers imports (Colab preinstalls it; CI installs it, so that this is exercised)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import export_hf
import pytest
import torch
from safetensors.torch import load_file, save_file

from bert import BertModel
from minbert.model.adapters import AdapterConfig
from minbert.model.multitask_bert import MultitaskBERT, freeze_encoder, save_multitask_model

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("transformers") is None:
    pytest.skip("transformers (an oracle, requirements-dev.txt) is not installed", allow_module_level=True)
pytestmark = pytest.mark.usefixtures("one_thread")
SENTENCES = ["A man is playing a guitar.", "The cat sat on the mat, and then it slept for hours."]

# `python -c ORACLE BATCH OUT EXPORT_DIR...`: for each export, transformers' hidden states of BATCH's token ids and,
# where it is installed, sentence-transformers' embeddings of SENTENCES, saved to OUT; prints where `datasets`
# came from.
ORACLE = f"""
import importlib.util, sys
import torch
from safetensors.torch import load_file, save_file
import transformers
torch.set_num_threads(1)
batch, out, *exports = sys.argv[1:]
batch = load_file(batch)
sentence_transformers = None
if importlib.util.find_spec("sentence_transformers") is not None:
    import sentence_transformers
results = {{}}
for index, export in enumerate(exports):
    with torch.no_grad():
        model = transformers.BertModel.from_pretrained(export).eval()
        results[f"{{index}}.hidden"] = model(input_ids=batch["input_ids"],
                                             attention_mask=batch["attention_mask"]).last_hidden_state
    if sentence_transformers is not None:
        model = sentence_transformers.SentenceTransformer(export, device="cpu")
        results[f"{{index}}.embeddings"] = model.encode({SENTENCES!r}, convert_to_tensor=True)
save_file({{name: value.contiguous() for name, value in results.items()}}, out)
print("datasets:", getattr(sys.modules.get("datasets"), "__file__", None))
"""


def outside_the_project_env() -> dict:
    """This process's environment without the project on PYTHONPATH, offline."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    kept = [entry for entry in env.pop("PYTHONPATH", "").split(os.pathsep)
            if entry and not Path(entry).resolve().is_relative_to(ROOT)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def run_oracles(tmp_path: Path, batch, *exports: Path) -> list[dict]:
    """The oracles' outputs for `batch`, one dict per export ("hidden", and "embeddings" where sentence-transformers
    is installed), computed by another Python whose working directory is tmp_path, outside the project."""
    save_file({"input_ids": batch["input_ids"].contiguous(), "attention_mask": batch["attention_mask"].contiguous()},
              tmp_path / "batch.safetensors")
    done = subprocess.run([sys.executable, "-c", ORACLE, str(tmp_path / "batch.safetensors"),
                           str(tmp_path / "oracles.safetensors"), *map(str, exports)],
                          cwd=tmp_path, env=outside_the_project_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    datasets_file = done.stdout.split("datasets:", 1)[1].strip()
    assert datasets_file == "None" or not Path(datasets_file).resolve().is_relative_to(ROOT), datasets_file
    results = load_file(tmp_path / "oracles.safetensors")
    return [{name.split(".", 1)[1]: value for name, value in results.items() if name.startswith(f"{index}.")}
            for index in range(len(exports))]


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


def test_export_loads_in_transformers_sentence_transformers_and_back_here(tmp_path, tiny_checkpoint, tokenizer):
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    expected = []
    for pooling in ("mean", "cls"):  # one oracle process for both: starting one is most of the test's time
        model = trained_checkpoint(tmp_path / pooling, tiny_checkpoint, pooling)
        assert export_hf.main([str(tmp_path / pooling / "best"), str(tmp_path / pooling / "out")]) == 0
        with torch.no_grad():
            ours = model.bert(batch["input_ids"], batch["attention_mask"])["last_hidden_state"]
            again = BertModel.from_pretrained(str(tmp_path / pooling / "out")).eval()(batch["input_ids"],
                                                                                     batch["attention_mask"])
            assert torch.equal(again["last_hidden_state"], ours)
            expected.append((ours, model.encode_sentences(batch["input_ids"], batch["attention_mask"])))
        assert json.loads((tmp_path / pooling / "out" / "heads.json").read_text())["pooling"] == pooling
    oracles = run_oracles(tmp_path, batch, tmp_path / "mean" / "out", tmp_path / "cls" / "out")
    for (ours, embeddings), theirs in zip(expected, oracles):
        assert (ours[real] - theirs["hidden"][real]).abs().max() < 1e-5
    if "embeddings" not in oracles[0]:
        pytest.skip("sentence-transformers (an oracle, requirements-dev.txt) is not installed")
    for (ours, embeddings), theirs in zip(expected, oracles):
        torch.testing.assert_close(theirs["embeddings"], embeddings, atol=1e-5, rtol=1e-4)


def test_per_task_adapters_export_merged_for_the_task_given(tmp_path, tiny_checkpoint, tokenizer, capsys):
    from minbert.model.adapters import activate
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
    from minbert.model.checkpoint import atomic_save
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


def test_an_export_removes_what_a_killed_export_left_in_its_folder(tmp_path, tiny_checkpoint):
    trained_checkpoint(tmp_path, tiny_checkpoint)
    partial = tmp_path / "out" / ".model.safetensors.k1ll3d00.minbert-partial"
    partial.mkdir(parents=True)
    (partial / ".tmpAbC123").write_bytes(b"\0" * 4096)  # safetensors' own temporary, as big as the weights
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out")]) == 0
    assert not partial.exists() and (tmp_path / "out" / "model.safetensors").is_file()


def test_a_run_exported_from_another_folder_finds_the_pretrained_model_it_recorded(tmp_path, tiny_checkpoint,
                                                                                    monkeypatch):
    """The run was started in project/ with --pretrained models/tiny --output_dir runs/x: relative to project/,
    not to the folder the export runs from."""
    import shutil
    project = tmp_path / "project"
    shutil.copytree(tiny_checkpoint, project / "models" / "tiny")
    model = MultitaskBERT(BertModel.from_pretrained(str(tiny_checkpoint)))
    save_multitask_model(model, project / "runs" / "x" / "best",
                         {"args": {"pretrained": "models/tiny", "output_dir": "runs/x", "max_length": 32}})
    monkeypatch.chdir(tmp_path)
    assert export_hf.main([str(project / "runs" / "x" / "best"), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "vocab.txt").read_bytes() == (tiny_checkpoint / "vocab.txt").read_bytes()


def test_an_export_over_a_pretrained_model_it_reads_or_its_checkpoints_folder_is_refused(tmp_path, tiny_checkpoint,
                                                                                         capsys):
    """Audit: OUT = the run's recorded --pretrained folder overwrote that model's model.safetensors and config.json.
    OUT at, inside or around a pretrained folder the export reads, or the folder holding the checkpoint, is refused
    in one line before anything loads or is written."""
    import shutil
    pretrained = tmp_path / "models" / "tiny"
    shutil.copytree(tiny_checkpoint, pretrained)
    run = tmp_path / "run"
    run.mkdir()
    trained_checkpoint(run, pretrained)
    before = {path: path.read_bytes() for folder in (pretrained, run) for path in folder.iterdir()}
    for out, given in ((pretrained, []), (pretrained / "hf", []), (tmp_path / "models", []), (run, []),
                       (pretrained, ["--pretrained", str(pretrained)])):
        assert export_hf.main([str(run / "best"), str(out), *given]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: out_dir {out}: "), err
    assert {path: path.read_bytes() for folder in (pretrained, run) for path in folder.iterdir()} == before
    assert not (pretrained / "hf").exists()


def test_task_is_refused_where_it_merges_nothing(tmp_path, tiny_checkpoint, capsys):
    """Audit: --task qqp on a model without adapters was accepted and did nothing (it only chooses which per-task
    adapters are merged)."""
    trained_checkpoint(tmp_path, tiny_checkpoint)
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out"), "--task", "qqp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --task qqp: ") and "no adapters" in err[0], err
    assert not (tmp_path / "out").exists()
    trained_checkpoint(tmp_path, tiny_checkpoint, adapter=AdapterConfig("lora", rank=2, sharing="shared"))
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out"), "--task", "qqp"]) == 2
    assert "its adapters are shared" in capsys.readouterr().err
    assert export_hf.main([str(tmp_path / "best"), str(tmp_path / "out")]) == 0  # shared adapters need no --task
