"""The WordPiece tokenizer must give Hugging Face BertTokenizerFast's ids."""
import csv
import random
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from base_bert import resolve_pretrained  # noqa: E402
from tokenizer import BertTokenizer  # noqa: E402

EDGE_CASES = [
    "", " ", "\t\n", "hello world", "Héllo wörld — naïve café, déjà vu!", "ÀÉÎÕÜ ß æ ø å",
    "日本語のテキストと中文字符", "emoji 🙂 and symbols ©®™ ½", "Don't stop-believing... (really?!)",
    "x " * 700, "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "http://example.com/a?b=c&d=e", "tab\tseparated\u00a0nbsp\u200bzero-width", "$1,000.50 vs 3.14%",
]


@pytest.fixture(scope="module")
def tokenizers():
    return (BertTokenizer.from_pretrained("minilm-l6"),
            transformers.BertTokenizerFast.from_pretrained(str(resolve_pretrained("minilm-l6"))))


def assert_same(ours, theirs, texts, pairs=None, **kwargs):
    a = ours(texts, text_pair=pairs, return_tensors="pt", **kwargs)
    b = theirs(texts, text_pair=pairs, return_tensors="pt", **kwargs)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("settings", [dict(padding=True, truncation=True, max_length=32),
                                      dict(padding=True, truncation=True),
                                      dict(padding="max_length", truncation=True, max_length=40)])
def test_edge_cases_match(tokenizers, settings):
    ours, theirs = tokenizers
    assert_same(ours, theirs, EDGE_CASES, **settings)
    assert_same(ours, theirs, EDGE_CASES, pairs=EDGE_CASES[::-1], **settings)


def test_single_text_without_tensors(tokenizers):
    ours, theirs = tokenizers
    assert ours("hello neural world") == dict(theirs("hello neural world"))
    assert ours("hello neural world")["input_ids"] == [101, 7592, 15756, 2088, 102]


def read_course_sentences(path, columns, limit):
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    random.Random(0).shuffle(rows)
    return [[row[c] for c in columns] for row in rows[:limit]]


def test_real_course_sentences_match(tokenizers, shared_dir):
    ours, theirs = tokenizers
    folder = shared_dir / "data" / "cs224n"
    singles = [r[0] for r in read_course_sentences(folder / "ids-sst-train.csv", ["sentence"], 150)]
    singles += [r[0] for r in read_course_sentences(folder / "ids-cfimdb-dev.csv", ["sentence"], 50)]
    pairs = read_course_sentences(folder / "quora-dev.csv", ["sentence1", "sentence2"], 150)
    pairs += read_course_sentences(folder / "sts-train.csv", ["sentence1", "sentence2"], 100)
    assert_same(ours, theirs, singles, padding=True, truncation=True, max_length=512)
    assert_same(ours, theirs, [p[0] for p in pairs], pairs=[p[1] for p in pairs],
                padding=True, truncation=True, max_length=64)


def test_vocab_txt_only_directory_matches(tokenizers, tmp_path):
    _, theirs = tokenizers
    shutil.copy(resolve_pretrained("minilm-l6") / "vocab.txt", tmp_path / "vocab.txt")
    from_vocab = BertTokenizer.from_pretrained(tmp_path)
    assert_same(from_vocab, theirs, EDGE_CASES, padding=True, truncation=True, max_length=48)


def test_settings_do_not_leak_between_calls(tokenizers):
    ours, _ = tokenizers
    long = ours(["word " * 50], padding=True, truncation=True, max_length=10)
    assert len(long["input_ids"][0]) == 10
    assert len(ours("word " * 50)["input_ids"]) == 52


def test_bad_arguments(tokenizers):
    ours, _ = tokenizers
    with pytest.raises(ValueError, match="text pairs"):
        ours(["a", "b"], text_pair=["c"])
    with pytest.raises(ValueError, match="padding=True"):
        ours(["a", "b c d"], return_tensors="pt")
