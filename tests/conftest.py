"""Shared fixtures and helpers: the offline data and reference folder beside the repo, the demo data, and a
tiny random BERT (hidden 32, 2 layers) with the real bert-base-uncased vocabulary of the bundled minilm-l6
tokenizer, so that model tests take seconds, not minutes.

Fixtures are found by pytest; the plain helpers are imported by test modules as `from conftest import ...`.
"""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DEMO = ROOT / "data" / "demo"

TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)
MAX_LENGTH = 32


def pytest_configure(config):
    """Under pytest-xdist (README's `-n auto`) the workers share the cores: each worker's torch ops and the scripts
    its tests start keep to one thread, or two workers' threads contend for the same two cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared (offline data and references) is not present")
    return SHARED


@pytest.fixture(scope="session")
def protocol_dir(shared_dir) -> Path:
    path = shared_dir / "data" / "protocol"
    if not path.is_dir():
        pytest.skip("../shared/data/protocol is not present")
    return path


# ---------------------------------------------------------------------------------------------------
# The tiny model


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model's kernels gain nothing from a second thread, and on a busy 2-core machine they
    spend most of their time waiting for it (a (80, 20, 32) linear: 0.4 ms alone, 20 ms with two).
    Modules that run the tiny model use it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def skip_figures(monkeypatch) -> None:
    """Whole runs without their figures: drawing and saving them (matplotlib, t-SNE) is most of a tiny run's time.
    For tests of training, resuming and the CSVs; history.json and forgetting.md are still written. The figures
    have their own tests (test_plots.py, test_embedding_analysis.py, test_calibration.py,
    test_end_to_end_with_smart)."""
    import minbert.reports.calibration as calibration
    import minbert.reports.plots as plots
    import multitask_classifier
    for name in ("plot_forgetting_matrix", "plot_training_curves", "plot_error_analysis"):
        monkeypatch.setattr(plots, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(calibration, "plot_reliability", lambda *args, **kwargs: None)
    monkeypatch.setattr(multitask_classifier, "write_tsne", lambda *args, **kwargs: None)
    monkeypatch.setattr(multitask_classifier, "check_figure_libraries", lambda *args, **kwargs: None)


@pytest.fixture
def no_plots(monkeypatch):
    """skip_figures for a test (a module-scoped fixture uses skip_figures in a pytest.MonkeyPatch.context())."""
    skip_figures(monkeypatch)


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizer import BertTokenizer
    return BertTokenizer.from_pretrained("minilm-l6")


def tiny_bert(seed: int = 0, **config):
    """A random tiny BertModel; `config` overrides TINY (e.g. hidden_dropout_prob=0.0)."""
    from base_bert import BertConfig
    from bert import BertModel
    torch.manual_seed(seed)
    return BertModel(BertConfig(**{**TINY, **config}))


def tiny_model(seed: int = 0, bert_config: dict | None = None, **heads):
    """A MultitaskBERT on a random tiny BERT; `heads` are MultitaskBERT's options (pooling, dropout, ...)."""
    from minbert.model.multitask_bert import MultitaskBERT
    bert = tiny_bert(seed, **(bert_config or {}))
    return MultitaskBERT(bert, **heads)


def deterministic_tiny_model(seed: int = 0, **heads):
    """A tiny model without any dropout, so that repeated forwards in train mode agree bitwise."""
    return tiny_model(seed, bert_config=dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                      dropout=0.0, **heads)


def hf_state_dict(model) -> dict:
    """minBERT's weights under Hugging Face names."""
    from base_bert import to_hf_state_dict
    return to_hf_state_dict(model.state_dict())


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A pretrained-style directory: random tiny weights under Hugging Face names, minilm's vocabulary.
    Read-only for the tests (shared by the whole session)."""
    from base_bert import resolve_pretrained
    directory = tmp_path_factory.mktemp("tiny-bert")
    (directory / "config.json").write_text(json.dumps({**TINY, "model_type": "bert"}))
    save_file(hf_state_dict(tiny_bert(0)), str(directory / "model.safetensors"))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        if (resolve_pretrained("minilm-l6") / name).is_file():
            shutil.copy(resolve_pretrained("minilm-l6") / name, directory / name)
    return directory


# ---------------------------------------------------------------------------------------------------
# The demo data


def demo_examples(task: str, split: str, n: int | None = None) -> list:
    """The first n examples of a demo split; task is an internal name (sst, qqp, sts)."""
    from minbert.data.batches import load_examples
    from minbert.tasks import course_file_name
    return load_examples(DEMO / course_file_name(task, split), task, split)[:n]


def pair_batch(tokenizer, task: str = "sts", n: int = 6, cross: bool = False) -> dict:
    from minbert.data.batches import collate_pairs
    return collate_pairs(demo_examples(task, "dev", n), tokenizer, MAX_LENGTH, cross_encoder=cross)


def sentence_batch(tokenizer, n: int = 6, split: str = "dev") -> dict:
    from minbert.data.batches import collate_sentences
    return collate_sentences(demo_examples("sst", split, n), tokenizer, MAX_LENGTH)


def output_flags() -> dict[tuple[str, str], str]:
    """(task, split) -> the course's flag of its leaderboard CSV, e.g. ('qqp', 'dev') -> 'para_dev_out'."""
    from minbert.tasks import MULTITASK, output_flag
    return {(task, split): output_flag(task, split) for task in MULTITASK for split in ("dev", "test")}


def prediction_flags(folder) -> list[str]:
    """The six leaderboard CSV flags of multitask_classifier.py, pointing at folder/{sst,para,sts}-{dev,test}-out.csv."""
    flags = []
    for prefix in ("sst", "para", "sts"):
        for split in ("dev", "test"):
            flags += [f"--{prefix}_{split}_out", str(folder / f"{prefix}-{split}-out.csv")]
    return flags


def exit_code(argv) -> int:
    """multitask_classifier.main's exit code, whether it returns it or argparse exits with it (flags are
    checked while parsing)."""
    import multitask_classifier
    try:
        return multitask_classifier.main(argv)
    except SystemExit as exit:
        return exit.code


@pytest.fixture
def model_must_not_load(monkeypatch):
    """Fails the test if any BERT is loaded (input validation must come first)."""
    from bert import BertModel

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was validated")
    monkeypatch.setattr(BertModel, "from_pretrained", refuse)
