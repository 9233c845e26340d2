"""classifier.py (minBERT part 1): the pretrain/finetune contract, an end-to-end run on the demo
data that prepare_submit accepts, checkpoint reload, and one-line errors for bad input."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import classifier
from base_bert import BertConfig
from bert import BertModel
from classifier import BertSentimentClassifier, load_classifier, main, parse_args, predict, train_epoch
from evaluation import check_predictions_file, read_predictions
from minbert.data.batches import load_sentence_examples, standard_paths
from optimizer import AdamW
from prepare_submit import build_submission, submission_predictions
from tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
TINY = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=16)
QUICK_RUN = ["--data_dir", str(DEMO), "--epochs", "1", "--max_train_examples", "32", "--batch_size", "16",
             "--max_length", "32", "--quiet"]


def one_step(option: str) -> tuple[BertSentimentClassifier, dict, dict]:
    """A tiny random classifier, its state before, and after one training step."""
    torch.manual_seed(0)
    model = BertSentimentClassifier(BertModel(BertConfig(**TINY)), num_labels=3, dropout=0.1, option=option)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = {"input_ids": torch.randint(1, 50, (4, 6)), "attention_mask": torch.ones(4, 6, dtype=torch.long),
             "labels": torch.tensor([0, 1, 2, 1])}
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    train_epoch(model, [batch], optimizer, torch.device("cpu"), quiet=True)
    return model, before, model.state_dict()


def test_pretrain_freezes_bert_and_trains_only_the_head():
    model, before, after = one_step("pretrain")
    assert not any(p.requires_grad for p in model.bert.parameters())
    bert_keys = [k for k in before if k.startswith("bert.")]
    assert bert_keys and all(torch.equal(before[k], after[k]) for k in bert_keys)
    assert not torch.equal(before["classifier.weight"], after["classifier.weight"])


def test_finetune_updates_every_bert_parameter():
    model, before, after = one_step("finetune")
    assert all(p.requires_grad for p in model.parameters())
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == []


def test_course_defaults():
    args = parse_args([])
    assert (args.option, args.epochs, args.lr, args.batch_size, args.hidden_dropout_prob, args.seed) == (
        "pretrain", 10, 1e-5, 8, 0.3, 11711)
    assert args.data_dir == "data" and args.predictions_dir == "predictions"


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory, tiny_checkpoint):
    """Both options end to end on the demo data; returns (predictions dir, checkpoint dir). pretrain on the tiny
    random BERT (minilm-l6's vocabulary: only the files are checked); finetune on minilm-l6, whose dev predictions
    hold both classes, so that reproducing them from the checkpoint tests the checkpoint."""
    out = tmp_path_factory.mktemp("classifier")
    for option, pretrained in (("pretrain", str(tiny_checkpoint)), ("finetune", "minilm-l6")):
        code = main(QUICK_RUN + ["--pretrained", pretrained, "--option", option,
                                 "--predictions_dir", str(out / "predictions"), "--output_dir", str(out / "runs")])
        assert code == 0
    return out / "predictions", out / "runs"


def test_prediction_files_answer_every_id_once_and_prepare_submit_accepts_them(quick_runs, tmp_path, monkeypatch):
    predictions_dir, _ = quick_runs
    for name, column_task, _ in submission_predictions("minbert"):
        _, dataset, split, _ = name.split("-")
        path = predictions_dir / name
        assert path.read_text().splitlines()[0] == "id,Predicted_Sentiment"
        expected_ids = [e.id for e in load_sentence_examples(standard_paths(DEMO)[(dataset, split)], dataset, split)]
        predicted = check_predictions_file(path, expected_ids, column_task)  # exactly these ids, none repeated
        assert set(predicted.values()) <= set(range(classifier.NUM_LABELS[dataset]))

    monkeypatch.chdir(ROOT)  # prepare_submit takes bert.py, classifier.py, optimizer.py from the working directory
    members = build_submission(predictions_dir, tmp_path / "submission.zip", "minbert")
    assert len(members) == 8 + 3


def test_best_checkpoint_reproduces_the_written_dev_predictions(quick_runs):
    predictions_dir, runs_dir = quick_runs
    model = load_classifier(runs_dir / "finetune-cfimdb-best")
    assert model.option == "finetune" and model.num_labels == 2
    examples = load_sentence_examples(DEMO / "ids-cfimdb-dev.csv", "cfimdb", "dev")
    ids, predicted = predict(model, examples, BertTokenizer.from_pretrained("minilm-l6"), torch.device("cpu"),
                             batch_size=64, max_length=32, quiet=True)
    assert len(set(predicted.tolist())) == 2  # both classes: a wrong or untrained head could not match by chance
    assert dict(zip(ids, predicted.tolist())) == read_predictions(predictions_dir / "finetune-cfimdb-dev-out.csv", "sst")


def test_bad_data_file_is_one_line_exit_2_before_the_model_loads(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for source in DEMO.glob("ids-*.csv"):
        (data_dir / source.name).write_bytes(source.read_bytes())
    bad = data_dir / "ids-cfimdb-test-student.csv"  # the last file read: all of them are checked up front
    bad.write_text(bad.read_text() + "99\t99.0\tdeadbeef\ta stray\ttab\n")
    # A model path that does not exist: reaching the model would give a different error.
    result = subprocess.run(
        [sys.executable, str(ROOT / "classifier.py"), "--data_dir", str(data_dir), "--pretrained",
         str(tmp_path / "no-model"), "--predictions_dir", str(tmp_path / "predictions"),
         "--output_dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}:22: expected 4 tab-separated fields")
    assert not (tmp_path / "predictions").exists() and not (tmp_path / "runs").exists()


def test_missing_pretrained_model_is_one_line_exit_2(tmp_path, capsys):
    code = main(["--data_dir", str(DEMO), "--pretrained", str(tmp_path / "no-model"),
                 "--predictions_dir", str(tmp_path / "predictions"), "--output_dir", str(tmp_path / "runs")])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'no-model'}: not a directory")


@pytest.mark.parametrize("where, problem", [
    ("its input", "would replace it, which this command reads"),
    ("another run's folder", "whose files belong to that run"),
    ("checkpoints in another run's folder", "whose files belong to that run"),
    ("checkpoints in the pretrained model's folder", "which this command reads"),
])
def test_outputs_never_replace_the_input_or_go_into_another_run(tmp_path, capsys, where, problem):
    inputs = tmp_path / "in"
    inputs.mkdir()
    test_file = inputs / "pretrain-sst-test-out.csv"  # a test split read from where its predictions would go
    test_file.write_bytes((DEMO / "ids-sst-test-student.csv").read_bytes())
    other = tmp_path / "other"
    other.mkdir()
    (other / "best.json").write_text("{}")
    pretrained = tmp_path / "model"
    pretrained.mkdir()
    flags = {"its input": ["--predictions_dir", str(inputs)],
             "another run's folder": ["--predictions_dir", str(other)],
             "checkpoints in another run's folder": ["--output_dir", str(other / "sub")],
             "checkpoints in the pretrained model's folder": ["--output_dir", str(pretrained / "runs")]}[where]
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    code = main(["--data_dir", str(DEMO), "--sst_test", str(test_file), "--pretrained", str(pretrained),
                 "--predictions_dir", str(tmp_path / "predictions"), "--output_dir", str(tmp_path / "runs"), *flags])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0]
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
