import csv
import re
import urllib.error
import zlib
from pathlib import Path

import download_data
import pytest
import torch

from minbert.data.batches import (DataError, DataWarning, LengthBucketSampler, PairExample, SentenceExample,
                                  collate_pairs, collate_sentences, example_lengths, load_examples,
                                  load_sentence_examples, load_split, make_dataloader, standard_paths, subsample)

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo"
SHARED = REPO.parent / "shared"
PROTOCOL = SHARED / "data" / "protocol"
needs_shared = pytest.mark.skipif(not PROTOCOL.is_dir(), reason="../shared/data/protocol is absent")

SST_HEADER = "\tid\tsentence\tsentiment\n"
PAIR_HEADER = "\tid\tsentence1\tsentence2\t{label}\n"


class FakeTokenizer:
    """Whitespace tokens hashed into ids, called like BertTokenizer: [CLS]=1, [SEP]=2, [PAD]=0; lists of ids
    without padding, tensors with padding=True and return_tensors="pt"."""

    CLS, SEP, PAD = 1, 2, 0
    pad_token_id = PAD

    def __call__(self, texts, text_pair=None, padding=False, truncation=False, max_length=512, return_tensors=None):
        assert (padding, return_tensors) in ((True, "pt"), (False, None))
        rows = []
        for i, text in enumerate(texts):
            first = [self.token_id(word) for word in text.split()]
            second = None if text_pair is None else [self.token_id(word) for word in text_pair[i].split()]
            if truncation:
                budget = max_length - (2 if second is None else 3)
                if second is None:
                    first = first[:budget]
                while second is not None and len(first) + len(second) > budget:
                    (first if len(first) >= len(second) else second).pop()
            ids = [self.CLS] + first + [self.SEP]
            types = [0] * len(ids)
            if second is not None:
                ids += second + [self.SEP]
                types += [1] * (len(second) + 1)
            rows.append((ids, types))
        if not padding:
            return {"input_ids": [ids for ids, _ in rows], "token_type_ids": [types for _, types in rows],
                    "attention_mask": [[1] * len(ids) for ids, _ in rows]}
        width = max(len(ids) for ids, _ in rows)
        pad = [width - len(ids) for ids, _ in rows]
        return {
            "input_ids": torch.tensor([ids + [self.PAD] * p for (ids, _), p in zip(rows, pad)]),
            "token_type_ids": torch.tensor([types + [0] * p for (_, types), p in zip(rows, pad)]),
            "attention_mask": torch.tensor([[1] * len(ids) + [0] * p for (ids, _), p in zip(rows, pad)]),
        }

    @staticmethod
    def token_id(word: str) -> int:
        return 3 + zlib.crc32(word.encode()) % 997


def write(tmp_path: Path, text: str | bytes, name: str = "data.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def sst_file(tmp_path: Path, *rows: str) -> Path:
    return write(tmp_path, SST_HEADER + "".join(row + "\n" for row in rows))


def hex_id(i: int) -> str:
    return f"{i:025x}"


# ---- loading the real course files ----------------------------------------------------------------

REAL_COUNTS = [("sst", "train", 8544), ("sst", "dev", 1101), ("sst", "test", 2210),
               ("cfimdb", "train", 1707), ("cfimdb", "dev", 245), ("cfimdb", "test", 488),
               ("qqp", "train", 31008), ("qqp", "dev", 20212), ("qqp", "test", 4000),
               ("sts", "train", 6040), ("sts", "dev", 863), ("sts", "test", 1725)]


@pytest.mark.slow
@needs_shared
@pytest.mark.parametrize("task,split,expected", REAL_COUNTS)
def test_real_files_load_every_row_as_the_course_dictreader_reads_it(task, split, expected):
    path = standard_paths(PROTOCOL)[(task, split)]
    with open(path, encoding="utf-8", newline="") as handle:
        course_rows = list(csv.DictReader(handle, delimiter="\t"))
    assert len(course_rows) == sum(1 for _ in open(path, encoding="utf-8")) - 1  # one physical line per row

    if (task, split) == ("qqp", "dev"):
        # The file has two rows whose is_duplicate cell is empty; the course's loader skipped them too.
        with pytest.warns(DataWarning, match=r"quora-dev\.csv: dropped 2 row\(s\).*lines 2577, 14222"):
            examples = load_split(PROTOCOL, task, split)
    else:
        examples = load_split(PROTOCOL, task, split)
    assert len(examples) == expected

    columns = ("sentence",) if task in ("sst", "cfimdb") else ("sentence1", "sentence2")
    label_column = {"sst": "sentiment", "cfimdb": "sentiment", "qqp": "is_duplicate", "sts": "similarity"}[task]
    by_id = {row["id"]: row for row in course_rows}
    for example in examples:
        row = by_id[example.id]
        texts = (example.sentence,) if task in ("sst", "cfimdb") else (example.sentence1, example.sentence2)
        assert texts == tuple(row[c].strip() for c in columns)
        assert example.label == (None if split == "test" else float(row[label_column]))


@pytest.mark.slow
@needs_shared
def test_real_labels_are_in_range_and_quoted_text_is_unescaped():
    sst = load_sentence_examples(PROTOCOL / "ids-sst-train.csv", "sst", "train")
    assert {e.label for e in sst} == {0, 1, 2, 3, 4}
    sts = {e.id: e for e in load_examples(PROTOCOL / "sts-train.csv", "sts", "train")}
    assert all(0.0 <= e.label <= 5.0 for e in sts.values())
    # sts-train.csv line 10 is a quoted field with doubled quotes inside.
    line_10 = (PROTOCOL / "sts-train.csv").read_text(encoding="utf-8").splitlines()[9]
    example = sts[line_10.split("\t")[1]]
    assert example.sentence1 == "In standard English, I think \"don't got\" has the same register as \"ain't\"."


# ---- file problems: one DataError naming the file, the line and the problem ------------------------

def test_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(DataError) as caught:
        load_sentence_examples(path, "sst", "train")
    assert str(caught.value) == f"{path}: file not found"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = write(tmp_path, content)
    with pytest.raises(DataError, match=re.escape(f"{path}: file is empty")):
        load_sentence_examples(path, "sst", "dev")


def test_header_without_rows(tmp_path):
    path = write(tmp_path, SST_HEADER)
    with pytest.raises(DataError, match="header but no data rows"):
        load_sentence_examples(path, "sst", "dev")


def test_missing_label_column_is_named_but_not_needed_for_test(tmp_path):
    path = write(tmp_path, f"\tid\tsentence\n0\t{hex_id(1)}\tfine film\n")
    with pytest.raises(DataError, match=re.escape(f"{path}:1: missing required column 'sentiment'")):
        load_sentence_examples(path, "sst", "train")
    assert load_sentence_examples(path, "sst", "test") == [SentenceExample(hex_id(1), "fine film", None)]


def test_missing_text_column_is_named(tmp_path):
    path = write(tmp_path, f"\tid\tsentence1\tsimilarity\n0\t{hex_id(1)}\ta\t1.0\n")
    with pytest.raises(DataError, match="missing required column 'sentence2'"):
        load_examples(path, "sts", "dev")


@pytest.mark.parametrize("task,label", [("sst", "5"), ("sst", "-1"), ("sst", "2.5"), ("cfimdb", "2"),
                                        ("cfimdb", "0.5"), ("qqp", "0.5"), ("qqp", "2.0"),
                                        ("sts", "5.1"), ("sts", "-0.2"), ("sts", "nan")])
def test_label_out_of_range(tmp_path, task, label):
    if task in ("sst", "cfimdb"):
        path = sst_file(tmp_path, f"0\t{hex_id(1)}\tgood\t1", f"1\t{hex_id(2)}\tbad\t{label}")
        loader = load_sentence_examples
    else:
        column = "is_duplicate" if task == "qqp" else "similarity"
        path = write(tmp_path, PAIR_HEADER.format(label=column)
                     + f"0\t{hex_id(1)}\ta\tb\t1.0\n1\t{hex_id(2)}\tc\td\t{label}\n")
        loader = load_examples
    with pytest.raises(DataError, match=re.escape(f"{path}:3: {task} label '{label}' out of range")):
        loader(path, task, "train")


def test_non_numeric_label(tmp_path):
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\tgood\tpositive")
    with pytest.raises(DataError, match=re.escape(f"{path}:2: label 'positive' is not a number")):
        load_sentence_examples(path, "sst", "dev")


def test_label_spellings_of_the_course_files(tmp_path):
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\ta\t3", f"1\t{hex_id(2)}\tb\t3.0", f"2\t{hex_id(3)}\tc\t 0 ")
    assert [e.label for e in load_sentence_examples(path, "sst", "train")] == [3, 3, 0]
    path = write(tmp_path, PAIR_HEADER.format(label="is_duplicate") + f"0\t{hex_id(1)}\ta\tb\t1\n", "q.csv")
    assert load_examples(path, "qqp", "train")[0].label == 1.0


def test_text_that_is_not_utf8_names_the_line(tmp_path):
    content = (SST_HEADER + f"0\t{hex_id(1)}\tfine\t2\n1\t{hex_id(2)}\tcaf").encode() + b"\xe9\t3\n"
    path = write(tmp_path, content)
    with pytest.raises(DataError, match=re.escape(f"{path}:3: text is not valid UTF-8 (byte 0xe9)")):
        load_sentence_examples(path, "sst", "train")


def test_row_with_wrong_number_of_fields(tmp_path):
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\tgood\t3", f"1\t{hex_id(2)}\ta stray\ttab\t3")
    with pytest.raises(DataError, match=re.escape(f"{path}:3: expected 4 tab-separated fields")):
        load_sentence_examples(path, "sst", "train")


def test_unbalanced_quote_is_reported_at_its_row(tmp_path):
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\tgood\t3", f'1\t{hex_id(2)}\t"never closed\t3',
                    f"2\t{hex_id(3)}\tother\t1")
    with pytest.raises(DataError, match=re.escape(f"{path}:3: expected 4 tab-separated fields")):
        load_sentence_examples(path, "sst", "train")


def test_duplicate_and_empty_ids(tmp_path):
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\ta\t3", f"1\t{hex_id(2)}\tb\t3", f"2\t{hex_id(1)}\tc\t3")
    with pytest.raises(DataError, match=re.escape(f"{path}:4: duplicate id '{hex_id(1)}' (first on line 2)")):
        load_sentence_examples(path, "sst", "test")
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\ta\t3", "1\t \tb\t3")
    with pytest.raises(DataError, match=re.escape(f"{path}:3: empty id")):
        load_sentence_examples(path, "sst", "train")


def test_quoting_tabs_crlf_and_index_columns_read_like_dictreader(tmp_path):
    rows = [f'0\t{hex_id(1)}\t"He said ""hi""\tthen left"\t4', f"1\t{hex_id(2)}\t  padded  \t0"]
    path = write(tmp_path, (SST_HEADER + "".join(r + "\n" for r in rows)).replace("\n", "\r\n"))
    assert load_sentence_examples(path, "sst", "train") == [
        SentenceExample(hex_id(1), 'He said "hi"\tthen left', 4), SentenceExample(hex_id(2), "padded", 0)]
    # The course's sentiment test files have two index columns under the header "0<TAB><TAB>id<TAB>sentence".
    path = write(tmp_path, f"0\t\tid\tsentence\n1\t0.0\t{hex_id(7)}\t nice \n", "test.csv")
    assert load_sentence_examples(path, "cfimdb", "test") == [SentenceExample(hex_id(7), "nice", None)]


def test_empty_sentences_are_dropped_in_train_with_a_warning_but_kept_in_dev_and_test(tmp_path):
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\tgood\t3", f"1\t{hex_id(2)}\t  \t1", f"2\t{hex_id(3)}\t\t2")
    with pytest.warns(DataWarning, match=re.escape(f"{path}: dropped 2 row(s) with an empty sentence (lines 3, 4)")):
        train = load_sentence_examples(path, "sst", "train")
    assert [e.id for e in train] == [hex_id(1)]
    for split in ("dev", "test"):
        assert [e.sentence for e in load_sentence_examples(path, "sst", split)] == ["good", "", ""]

    pairs = write(tmp_path, PAIR_HEADER.format(label="similarity")
                  + f"0\t{hex_id(1)}\ta\tb\t1.0\n1\t{hex_id(2)}\tc\t\t2.0\n", "sts.csv")
    with pytest.warns(DataWarning, match="dropped 1 row"):
        assert len(load_examples(pairs, "sts", "train")) == 1
    assert load_examples(pairs, "sts", "dev")[1] == PairExample(hex_id(2), "c", "", 2.0)


def test_rows_with_an_empty_label_are_dropped_with_a_warning(tmp_path):
    path = write(tmp_path, PAIR_HEADER.format(label="is_duplicate")
                 + f"0\t{hex_id(1)}\ta\tb\t1.0\n1\t{hex_id(2)}\tc\td\t\n")
    with pytest.warns(DataWarning, match=re.escape("dropped 1 row(s) with an empty 'is_duplicate' label (lines 3)")):
        assert [e.id for e in load_examples(path, "qqp", "dev")] == [hex_id(1)]


def test_a_file_with_no_usable_rows_is_an_error(tmp_path):
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\t\t3")
    with pytest.warns(DataWarning), pytest.raises(DataError, match="no usable rows"):
        load_sentence_examples(path, "sst", "train")


def test_unknown_task_or_split(tmp_path):
    path = sst_file(tmp_path, f"0\t{hex_id(1)}\tgood\t3")
    with pytest.raises(ValueError, match="task"):
        load_sentence_examples(path, "qqp", "train")
    with pytest.raises(ValueError, match="split"):
        load_sentence_examples(path, "sst", "validation")


def test_standard_paths_are_the_course_file_names(tmp_path):
    paths = standard_paths(tmp_path)
    assert len(paths) == 15
    assert paths[("qa", "train")] == tmp_path / "train-v2.0.json"  # SQuAD's official names
    assert paths[("sst", "test")] == tmp_path / "ids-sst-test-student.csv"
    assert paths[("cfimdb", "train")] == tmp_path / "ids-cfimdb-train.csv"
    assert paths[("qqp", "dev")] == tmp_path / "quora-dev.csv"
    assert paths[("sts", "test")] == tmp_path / "sts-test-student.csv"


# ---- batching ----------------------------------------------------------------------------------------

def test_collate_sentences_pads_to_the_longest_and_truncates():
    examples = [SentenceExample("a", "one two three", 1), SentenceExample("b", "four", 4)]
    batch = collate_sentences(examples, FakeTokenizer(), max_length=16)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["token_type_ids"].shape == (2, 5)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 4]
    assert batch["ids"] == ["a", "b"]
    truncated = collate_sentences([SentenceExample("c", "w " * 50, None)], FakeTokenizer(), max_length=8)
    assert truncated["input_ids"].shape == (1, 8) and truncated["labels"] is None


def test_collate_pairs_encodes_each_side_separately_or_jointly():
    examples = [PairExample("a", "x y z", "p", 1.0), PairExample("b", "x", "p q", 0.0)]
    separate = collate_pairs(examples, FakeTokenizer(), max_length=32, label_dtype=torch.float32)
    for side, width in (("_1", 5), ("_2", 4)):
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            assert separate[key + side].shape == (2, width)
    assert separate["labels"].dtype == torch.float32 and separate["ids"] == ["a", "b"]
    assert "input_ids" not in separate

    joint = collate_pairs(examples, FakeTokenizer(), max_length=32, label_dtype=torch.float32, cross_encoder=True)
    assert set(joint) == {"input_ids", "attention_mask", "token_type_ids", "lengths", "labels", "ids"}
    assert joint["input_ids"].shape == (2, 7)  # [CLS] x y z [SEP] p [SEP]
    assert joint["lengths"].tolist() == [7, 6] and separate["lengths_2"].tolist() == [3, 4]
    assert joint["token_type_ids"][0].tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert joint["attention_mask"][1].tolist() == [1, 1, 1, 1, 1, 1, 0]

    unlabelled = [PairExample("c", "x", "y", None)]
    assert collate_pairs(unlabelled, FakeTokenizer(), 32, torch.float32)["labels"] is None
    with pytest.raises(ValueError, match="mixes"):
        collate_pairs(examples + unlabelled, FakeTokenizer(), 32, torch.float32)


def test_pair_lengths_use_the_longer_side_or_the_sum():
    pair = [PairExample("a", "one two three", "four, five", None)]
    assert example_lengths(pair) == [3]
    assert example_lengths(pair, cross_encoder=True) == [6]


def padded_tokens(batches, lengths):
    return sum(max(lengths[i] for i in batch) * len(batch) for batch in batches)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n,batch_size", [(1, 4), (37, 4), (1000, 16), (64, 8)])
def test_sampler_yields_every_index_exactly_once(shuffle, n, batch_size):
    lengths = [(i * 7919) % 53 for i in range(n)]
    sampler = LengthBucketSampler(lengths, batch_size, shuffle=shuffle, seed=3, bucket_size_multiplier=5)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(n))
        assert len(batches) == len(sampler)
        assert all(1 <= len(batch) <= batch_size for batch in batches)


def test_sampler_is_deterministic_per_seed_and_epoch():
    lengths = list(range(500))
    def batches(seed, epoch):
        sampler = LengthBucketSampler(lengths, 8, shuffle=True, seed=seed, bucket_size_multiplier=4)
        sampler.set_epoch(epoch)
        return list(sampler)
    assert batches(0, 0) == batches(0, 0)
    assert batches(0, 0) != batches(0, 1)
    assert batches(0, 0) != batches(1, 0)


def test_sampler_shuffles_the_batches_of_a_sorted_bucket():
    lengths = list(range(400))
    batches = list(LengthBucketSampler(lengths, 8, shuffle=True, seed=0, bucket_size_multiplier=100))
    assert all(batch == sorted(batch) for batch in batches)  # one bucket, sorted by length
    assert [b[0] for b in batches] != sorted(b[0] for b in batches)


def test_bucketing_reduces_padding():
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 120, (2000,), generator=generator).tolist()
    order = torch.randperm(2000, generator=generator).tolist()
    random_batches = [order[i:i + 16] for i in range(0, 2000, 16)]
    bucketed = list(LengthBucketSampler(lengths, 16, shuffle=True, seed=0))
    assert padded_tokens(bucketed, lengths) < 0.7 * padded_tokens(random_batches, lengths)


def test_eval_sampler_goes_longest_first():
    lengths = [3, 9, 1, 7, 5]
    assert list(LengthBucketSampler(lengths, 2, shuffle=False)) == [[1, 3], [4, 0], [2]]


def test_make_dataloader_covers_every_example_once_and_picks_the_collate():
    sentences = [SentenceExample(f"s{i}", "word " * (i % 9 + 1), i % 5) for i in range(45)]
    loader = make_dataloader(sentences, FakeTokenizer(), batch_size=8, shuffle=True, seed=1)
    loader.batch_sampler.set_epoch(2)
    seen = [example_id for batch in loader for example_id in batch["ids"]]
    assert sorted(seen) == sorted(e.id for e in sentences)

    pairs = [PairExample(f"p{i}", "a b " * (i % 4 + 1), "c", float(i % 2)) for i in range(10)]
    eval_batches = list(make_dataloader(pairs, FakeTokenizer(), batch_size=4, shuffle=False, cross_encoder=True))
    assert sorted(i for b in eval_batches for i in b["ids"]) == sorted(e.id for e in pairs)
    assert "input_ids" in eval_batches[0] and eval_batches[0]["labels"].dtype == torch.float32
    with pytest.raises(ValueError, match="cross_encoder"):
        make_dataloader(sentences, FakeTokenizer(), batch_size=8, shuffle=False, cross_encoder=True)


def test_subsample_is_deterministic_and_keeps_file_order():
    examples = list(range(100))
    picked = subsample(examples, 10, seed=5)
    assert picked == subsample(examples, 10, seed=5) == sorted(picked)
    assert len(set(picked)) == 10 and picked != subsample(examples, 10, seed=6)
    assert subsample(examples, None, seed=0) == examples == subsample(examples, 500, seed=0)
    with pytest.raises(ValueError):
        subsample(examples, 0, seed=0)


def test_the_real_tokenizer_fits_the_collate_functions():
    tokenizer_module = pytest.importorskip("tokenizer")
    try:
        tokenizer = tokenizer_module.BertTokenizer.from_pretrained("minilm-l6")
    except Exception as err:  # no local weights/vocabulary on this machine
        pytest.skip(f"minilm-l6 tokenizer unavailable: {err}")
    pairs = [PairExample("a", "A man is playing a guitar.", "A man plays guitar.", 4.8),
             PairExample("b", "Is it safe?", "", 0.2)]
    joint = collate_pairs(pairs, tokenizer, max_length=64, label_dtype=torch.float32, cross_encoder=True)
    first_sep = joint["input_ids"][0].tolist().index(tokenizer.sep_token_id)
    assert joint["input_ids"][0, 0] == tokenizer.cls_token_id
    assert joint["token_type_ids"][0, first_sep + 1] == 1 and joint["token_type_ids"][0, first_sep] == 0
    separate = collate_pairs(pairs, tokenizer, max_length=64, label_dtype=torch.float32)
    assert separate["input_ids_2"][1, :2].tolist() == [tokenizer.cls_token_id, tokenizer.sep_token_id]
    assert separate["token_type_ids_1"].sum() == 0
    batch = collate_sentences([SentenceExample("c", "word " * 300, 2)], tokenizer, max_length=32)
    assert batch["input_ids"].shape == (1, 32) and batch["input_ids"][0, -1] == tokenizer.sep_token_id


# ---- demo data ---------------------------------------------------------------------------------------

DEMO_SIZES = {"sst": (160, 40, 40), "cfimdb": (60, 20, 20), "qqp": (160, 40, 40), "sts": (160, 40, 40)}


@pytest.mark.parametrize("task", sorted(DEMO_SIZES))
def test_demo_data_loads_with_sensible_labels(task):
    splits = {split: load_split(DEMO, task, split) for split in ("train", "dev", "test")}
    assert tuple(len(splits[s]) for s in ("train", "dev", "test")) == DEMO_SIZES[task]
    all_ids = [e.id for examples in splits.values() for e in examples]
    assert all(re.fullmatch(r"[0-9a-f]{25}", i) for i in all_ids) and len(set(all_ids)) == len(all_ids)
    assert all(e.label is None for e in splits["test"])
    labels = [e.label for s in ("train", "dev") for e in splits[s]]
    if task == "sst":
        assert sorted(set(labels)) == [0, 1, 2, 3, 4]
    elif task == "cfimdb":
        assert labels.count(1) == labels.count(0)
    elif task == "qqp":
        assert set(labels) == {0.0, 1.0} and 0.35 <= sum(labels) / len(labels) <= 0.45
    else:
        assert min(labels) <= 0.4 and max(labels) >= 4.8 and all(0 <= x <= 5 for x in labels)
        assert sum(1 <= x <= 4 for x in labels) >= len(labels) / 3  # spread over the range, not two clusters


@pytest.mark.slow
@needs_shared
def test_demo_sentences_are_not_taken_from_the_real_data():
    def texts(directory):
        found = set()
        for (task, split) in standard_paths(directory):
            if task == "qa":  # the SQuAD demo's texts: tests/test_squad.py
                continue
            for example in load_split(directory, task, split):
                if isinstance(example, SentenceExample):
                    found.add(example.sentence.lower())
                else:
                    found.update((example.sentence1.lower(), example.sentence2.lower()))
        return found
    with pytest.warns(DataWarning):  # quora-dev's two unlabelled rows
        real = texts(PROTOCOL)
    assert not texts(DEMO) & real


# ---- scripts/download_data.py ------------------------------------------------------------------------

def test_download_offline_says_where_the_files_go(tmp_path, monkeypatch, capsys):
    script = download_data
    def offline(url, timeout=60.0):
        raise urllib.error.URLError("Name or service not known")
    monkeypatch.setattr(script, "fetch", offline)
    assert script.main(["--data_dir", str(tmp_path / "data")]) == 1
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "offline" in message and str(tmp_path / "data") in message
    assert all(path.name in message for path in standard_paths(tmp_path).values())
    assert list((tmp_path / "data").iterdir()) == []


def test_download_checks_row_counts_and_writes_atomically(tmp_path, monkeypatch, capsys):
    script = download_data
    two_rows = SST_HEADER + f"0\t{hex_id(1)}\ta\t1\n1\t{hex_id(2)}\t\"b \"\"q\"\"\"\t2\n"
    monkeypatch.setattr(script, "fetch", lambda url, timeout=60.0: two_rows.encode())
    monkeypatch.setattr(script, "EXPECTED_ROWS", dict.fromkeys(script.EXPECTED_ROWS, 2))
    assert script.main(["--data_dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(script.EXPECTED_ROWS)
    assert (tmp_path / "sts-dev.csv").read_text() == two_rows

    monkeypatch.setattr(script, "EXPECTED_ROWS", dict(script.EXPECTED_ROWS, **{"ids-sst-dev.csv": 3}))
    (tmp_path / "ids-sst-dev.csv").unlink()
    assert script.main(["--data_dir", str(tmp_path)]) == 1
    assert "ids-sst-dev.csv: 2 data rows, expected 3; nothing written" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(script.EXPECTED_ROWS) - {"ids-sst-dev.csv"})


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--data_dir", "FILE"], "--data_dir FILE: cannot write there, FILE is a file, not a folder"),
    (["--base_url", "notaurl"], "argument --base_url: 'notaurl' is not an http(s), ftp or file URL"),
    (["--base_url", "https://example.org/data"], "argument --base_url: 'https://example.org/data' must end in /"),
    (["--squad_url", "https://example.org/"], "--squad_url would do nothing without --squad"),
])
def test_download_refuses_bad_flags_in_one_line_before_fetching(tmp_path, monkeypatch, capsys, flags, message):
    """A file as --data_dir (FileExistsError) and a --base_url urllib cannot open (ValueError) were tracebacks, and
    --squad_url without --squad was ignored (audit)."""
    (tmp_path / "FILE").write_text("a file")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(download_data, "fetch", None)  # never reached
    with pytest.raises(SystemExit) as stopped:
        download_data.main(flags)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f": error: {message}" in err and err.count("\n") == 1


@needs_shared
def test_download_expected_counts_match_the_real_files(tmp_path):
    script = download_data
    assert script.main(["--data_dir", str(tmp_path), "--base_url", PROTOCOL.as_uri() + "/"]) == 0
    assert all((tmp_path / name).read_bytes() == (PROTOCOL / name).read_bytes() for name in script.EXPECTED_ROWS)
