"""python scripts/benchmark.py qa_peer (the transformers peer of the SQuAD 2.0 run) end to end on a tiny random
BERT and a tiny SQuAD file: it trains, evaluates and writes every field; --compare_steps times both models on the
same batches."""
import json

import pytest

transformers = pytest.importorskip("transformers")

import benchmark  # noqa: E402  (the command line: scripts/ is on pytest's pythonpath)
from minbert.benchmarks.qa_peer import (QAPeerSettings, minbert_span_model, qa_batch_of,  # noqa: E402
                                        qa_load_split, qa_transformers_loss, qa_transformers_model)

pytestmark = pytest.mark.usefixtures("one_thread")

ARTICLES = [
    ("Normans", "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a "
                "region in France. They were descended from Norse raiders and pirates from Denmark, Iceland and "
                "Norway who, under their leader Rollo, agreed to swear fealty to King Charles III of West Francia.",
     [("Where is Normandy?", "France"), ("Who led the Norse raiders?", "Rollo"),
      ("Who did the Normans fight in Japan?", None)]),
    ("Rhine", "The Rhine is a European river that begins in the Swiss canton of Graubunden in the southeastern "
              "Swiss Alps, forms part of the Swiss-Austrian, Swiss-Liechtenstein border, Swiss-German and then "
              "the Franco-German border, then flows through the Rhineland and eventually empties into the North Sea "
              "in the Netherlands.",
     [("Where does the Rhine begin?", "Swiss canton of Graubunden"), ("Where does the Rhine end?", "North Sea"),
      ("How cold is the Rhine in winter?", None)]),
    ("Oxygen", "Oxygen is a chemical element with symbol O and atomic number 8. It is a member of the chalcogen "
               "group on the periodic table and is a highly reactive nonmetal and oxidizing agent that readily forms "
               "compounds with most elements.",
     [("What is the symbol of oxygen?", "O"), ("What is the atomic number of oxygen?", "8"),
      ("Who discovered oxygen on Mars?", None)]),
]


def write_squad(path, articles, prefix: str) -> None:
    data = []
    for title, context, questions in articles:
        qas = []
        for number, (question, answer) in enumerate(questions):
            qa = {"id": f"{prefix}-{title}-{number}", "question": question, "is_impossible": answer is None,
                  "answers": [] if answer is None else [{"text": answer, "answer_start": context.index(answer)}]}
            qas.append(qa)
        data.append({"title": title, "paragraphs": [{"context": context, "qas": qas}]})
    path.write_text(json.dumps({"version": "v2.0", "data": data}))


@pytest.fixture(scope="module")
def squad_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("squad")
    write_squad(directory / "train-v2.0.json", ARTICLES, "train")
    write_squad(directory / "dev-v2.0.json", ARTICLES[:2], "dev")
    return directory


def flags(tiny_checkpoint, squad_dir, out, *extra):
    return ["--data_dir", str(squad_dir), "--pretrained", str(tiny_checkpoint), "--max_length", "48",
            "--doc_stride", "16", "--batch_size", "4", "--epochs", "1", "--out", str(out), *extra]


def test_the_peer_trains_evaluates_and_writes_every_field(tiny_checkpoint, squad_dir, tmp_path, capsys):
    out = tmp_path / "peer.json"
    assert benchmark.main(["qa_peer", *flags(tiny_checkpoint, squad_dir, out)]) == 0
    result = json.loads(out.read_text())
    assert result["settings"]["pad_to_max_length"] is True and result["settings"]["threads"] == 1
    assert result["train_questions"] == 9 and result["dev_questions"] == 6
    assert result["train_windows"] > result["train_questions"]  # contexts longer than a 48-token window
    assert result["dev_windows"] >= result["dev_questions"]
    train = result["train"]
    assert train["steps"] == -(-result["train_windows"] // 4)
    assert train["step_seconds"] > 0 and train["train_seconds"] >= train["step_seconds"]
    assert any("qa_outputs" in key for key in result["loading_info"]["missing_keys"])  # the new head
    for at in ("tau0", "tuned"):
        metrics = result["dev"][at]
        for key in ("em", "f1", "has_answer_f1", "no_answer_f1"):
            assert 0.0 <= metrics[key] <= 1.0
    assert result["dev"]["tau0"]["tau"] == 0.0
    assert result["dev"]["tuned"]["f1"] >= result["dev"]["tau0"]["f1"]  # tau is chosen to maximise dev F1
    assert "transformers peer:" in capsys.readouterr().out


def test_compare_steps_times_both_models_on_the_same_batches(tiny_checkpoint, squad_dir, tmp_path):
    out = tmp_path / "steps.json"
    argv = flags(tiny_checkpoint, squad_dir, out, "--compare_steps", "2", "--no-pad_to_max_length")
    assert benchmark.main(["qa_peer", *argv]) == 0
    compare = json.loads(out.read_text())["compare_steps"]
    assert compare["timed_steps"] == 2 and len(compare["batch_tokens"]) == 2
    for side in ("transformers", "minbert"):
        assert compare[side]["median_step_seconds"] > 0
    assert compare["speedup_minbert_vs_transformers"] > 0


def test_both_models_give_the_same_loss_on_the_same_batch(tiny_checkpoint, squad_dir, tokenizer):
    """The comparison is fair only if the two are the same function: equal weights and head, the same loss."""
    import torch
    settings = QAPeerSettings(data_dir=squad_dir, seed=0, max_length=48, doc_stride=16, batch_size=4)
    windows = qa_load_split(settings, "train", tokenizer)
    reference, _ = qa_transformers_model(tiny_checkpoint, 0)
    ours = minbert_span_model(tiny_checkpoint, reference)
    reference.eval(), ours.eval()
    for pad_to in (None, 48):
        batch = qa_batch_of(windows, list(range(4)), pad_to)
        with torch.no_grad():
            assert torch.allclose(qa_transformers_loss(reference, batch), ours(batch), atol=1e-5)
