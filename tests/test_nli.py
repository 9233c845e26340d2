"""nli.py: NLI pairs from every supported source, triplets made from them, duplicates across sources dropped, and
malformed files named with their line and problem."""
import json
import os
from pathlib import Path

import pytest

from minbert.data.batches import DataError, DataWarning
from minbert.data.nli import NLIPair, NLITriplet, build_triplets, load_nli_pairs, load_nli_triplets

NLI = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "nli"


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(records):
    return "".join(json.dumps(record) + "\n" for record in records)


def test_jsonl_unified_format(tmp_path):
    path = write(
        tmp_path / "dev.jsonl",
        jsonl(
            [
                {"premise": "A man sleeps.", "hypothesis": "A person rests.", "label": "entailment"},
                {"premise": "A man sleeps.", "hypothesis": " A man runs. ", "label": "Contradiction", "tag": "r1"},
            ]
        )
        + "\n",  # a trailing blank line is fine
    )
    assert load_nli_pairs(path) == [
        NLIPair("A man sleeps.", "A person rests.", "entailment"),
        NLIPair("A man sleeps.", "A man runs.", "contradiction"),
    ]


def test_jsonl_original_snli_keys_skip_missing_gold_labels(tmp_path):
    path = write(
        tmp_path / "snli_1.0_dev.jsonl",
        jsonl(
            [
                {"sentence1": "Kids play.", "sentence2": "Children play.", "gold_label": "entailment"},
                {"sentence1": "Kids play.", "sentence2": "Kids sleep.", "gold_label": "-"},
                {"sentence1": "Kids play.", "sentence2": "Kids are outside.", "gold_label": "neutral"},
            ]
        ),
    )
    with pytest.warns(DataWarning, match=r"skipped 1 example\(s\) without a gold label \(lines 2\)"):
        pairs = load_nli_pairs(path)
    assert [pair.label for pair in pairs] == ["entailment", "neutral"]


def test_jsonl_integer_labels(tmp_path):
    records = [{"premise": "P", "hypothesis": f"H{label}", "label": label} for label in (0, 1, 2, -1)]
    with pytest.warns(DataWarning):
        pairs = load_nli_pairs(write(tmp_path / "hf.jsonl", jsonl(records)))
    assert [pair.label for pair in pairs] == ["entailment", "neutral", "contradiction"]


def write_senteval(directory, split, premises, hypotheses, labels):
    directory.mkdir(exist_ok=True)
    for prefix, lines in (("s1", premises), ("s2", hypotheses), ("labels", labels)):
        write(directory / f"{prefix}.{split}", "".join(line + "\n" for line in lines))
    return directory


def test_a_line_ends_at_a_newline_alone(tmp_path):
    """A raw U+2028 is valid inside a JSON string; str.splitlines() cut the record in two there."""
    premise = "A man sleeps.\u2028Quietly."
    path = tmp_path / "dev.jsonl"
    path.write_text(json.dumps({"premise": premise, "hypothesis": "A person rests.", "label": "entailment"},
                               ensure_ascii=False) + "\r\n", encoding="utf-8", newline="")
    assert load_nli_pairs(path) == [NLIPair(premise, "A person rests.", "entailment")]


def test_senteval_by_file_or_by_directory_and_split(tmp_path):
    directory = write_senteval(
        tmp_path / "SNLI", "dev", ["Two dogs run . ", "Two dogs run . "], ["Dogs move . ", "Cats sit . "],
        ["entailment", "contradiction"],
    )
    expected = [
        NLIPair("Two dogs run .", "Dogs move .", "entailment"),
        NLIPair("Two dogs run .", "Cats sit .", "contradiction"),
    ]
    assert load_nli_pairs(directory / "s1.dev") == expected
    assert load_nli_pairs(directory, split="dev") == expected


def test_sick_with_upper_case_labels(tmp_path):
    header = "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set\n"
    rows = (
        "1\tA kid plays\tA child plays\tENTAILMENT\t4.5\tTRAIN\n"
        "2\tA kid plays\tNobody plays\tCONTRADICTION\t2.0\tTEST\n"
    )
    pairs = load_nli_pairs(write(tmp_path / "SICK.txt", header + rows))
    assert pairs == [
        NLIPair("A kid plays", "A child plays", "entailment"),
        NLIPair("A kid plays", "Nobody plays", "contradiction"),
    ]


@pytest.mark.parametrize("header", ["premise,positive,negative", "sent0,sent1,hard_neg"])
def test_triplet_csv_round_trips_through_build_triplets(tmp_path, header):
    rows = ['A dog barks,An animal makes noise,A cat sleeps', 'A dog barks,"A dog is loud, very",The dog is silent']
    path = write(tmp_path / "triplets.csv", header + "\n" + "\n".join(rows) + "\n")
    pairs = load_nli_pairs(path)
    assert [pair.label for pair in pairs] == ["entailment", "contradiction"] * 2
    assert build_triplets(pairs) == [
        NLITriplet("A dog barks", "An animal makes noise", "A cat sleeps"),
        NLITriplet("A dog barks", "A dog is loud, very", "The dog is silent"),
    ]


def test_build_triplets_pairs_entailments_with_contradictions_per_premise():
    pairs = [
        NLIPair("P1", "e1", "entailment"),
        NLIPair("P2", "c3", "contradiction"),
        NLIPair("P1", "n1", "neutral"),
        NLIPair("P1", "c1", "contradiction"),
        NLIPair("P1", "e2", "entailment"),
        NLIPair("P2", "e3", "entailment"),
        NLIPair("P1", "e4", "entailment"),
        NLIPair("P1", "c2", "contradiction"),
        NLIPair("P3", "e5", "entailment"),  # no contradiction: no triplet
    ]
    assert build_triplets(pairs) == [
        NLITriplet("P1", "e1", "c1"),
        NLITriplet("P1", "e2", "c2"),  # min(3 entailments, 2 contradictions) = 2
        NLITriplet("P2", "e3", "c3"),
    ]


def test_product_pairs_every_entailment_with_every_contradiction_as_the_thesis_merge():
    """The thesis' listing B.1 merges the entailment rows with the contradiction rows on the premise: an inner join,
    #entailment x #contradiction triplets per premise (in build_triplets' order: the batches shuffle them anyway)."""
    pairs = [
        NLIPair("P1", "e1", "entailment"),
        NLIPair("P2", "c3", "contradiction"),
        NLIPair("P1", "c1", "contradiction"),
        NLIPair("P1", "e2", "entailment"),
        NLIPair("P2", "e3", "entailment"),
        NLIPair("P1", "c2", "contradiction"),
        NLIPair("P3", "e5", "entailment"),  # no contradiction: no triplet
    ]
    assert build_triplets(pairs, "product") == [
        NLITriplet("P1", "e1", "c1"), NLITriplet("P1", "e1", "c2"),
        NLITriplet("P1", "e2", "c1"), NLITriplet("P1", "e2", "c2"),
        NLITriplet("P2", "e3", "c3"),
    ]
    with pytest.raises(ValueError, match="unknown pairing 'merge'"):
        build_triplets(pairs, "merge")


def test_load_nli_triplets_drops_a_tokenized_copy_and_counts(tmp_path):
    original = write(
        tmp_path / "snli.jsonl",
        jsonl(
            [
                {"premise": 'A sign reads "Open."', "hypothesis": "A sign is there.", "label": "entailment"},
                {"premise": 'A sign reads "Open."', "hypothesis": "There's no sign.", "label": "contradiction"},
                {"premise": "Rain falls.", "hypothesis": "It is wet.", "label": "entailment"},
                {"premise": "Rain falls.", "hypothesis": "It is dry.", "label": "contradiction"},
            ]
        ),
    )
    tokenized = write_senteval(
        tmp_path / "senteval",
        "dev",
        ["A sign reads `` Open . '' ", "A sign reads `` Open . '' ", "Snow falls . ", "Snow falls . "],
        ["A sign is there . ", "There 's no sign . ", "It is cold . ", "It is hot . "],
        ["entailment", "contradiction", "entailment", "contradiction"],
    )
    triplets, counts = load_nli_triplets([original, tokenized / "s1.dev"])
    assert triplets == [
        NLITriplet('A sign reads "Open."', "A sign is there.", "There's no sign."),
        NLITriplet("Rain falls.", "It is wet.", "It is dry."),
        NLITriplet("Snow falls .", "It is cold .", "It is hot ."),
    ]
    assert [(c.pairs, c.triplets, c.duplicates_dropped) for c in counts] == [(4, 2, 0), (4, 1, 1)]
    assert "1 duplicates dropped" in str(counts[1])
    assert len(load_nli_triplets([original, tokenized / "s1.dev"], dedupe=False)[0]) == 4


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("a.jsonl", '{"premise": "P", "hypothesis": "H", "label": "neutral"}\n{"premise": "P",\n', ":2: invalid JSON"),
        ("a.jsonl", '["P", "H", "entailment"]\n', ":1: expected a JSON object"),
        ("a.jsonl", '{"premise": "P", "label": "entailment"}\n', ":1: missing field 'hypothesis'"),
        ("a.jsonl", '{"premise": "P", "hypothesis": "H", "label": "maybe"}\n', ":1: unknown label 'maybe'"),
        ("a.jsonl", '{"premise": "P", "hypothesis": "H", "label": true}\n', ":1: unknown label True"),
        ("a.jsonl", '{"premise": "P", "hypothesis": 3, "label": "neutral"}\n', ":1: field 'hypothesis' must be"),
        ("SICK.txt", "pair_ID\tsentence_A\tsentence_B\n", ":1: not a SICK header, missing column 'entailment_label'"),
        ("SICK.txt", "sentence_A\tsentence_B\tentailment_label\nA\tB\n", ":2: expected 3 tab-separated fields, got 2"),
        ("SICK.txt", "sentence_A\tsentence_B\tentailment_label\nA\tB\t-\n", ":2: entailment_label is missing"),
        ("t.csv", "anchor,positive,negative\nA,B,C\n", ":1: expected header premise,positive,negative"),
        ("t.csv", "premise,positive,negative\nA,B,C\nA,B\n", ":3: expected 3 comma-separated fields, got 2"),
        ("t.csv", "", ":1: expected header premise,positive,negative or sent0,sent1,hard_neg, got an empty file"),
        ("data.tsv", "x\ty\n", ": unrecognised NLI source"),
    ],
)
def test_bad_input_names_file_line_and_problem(tmp_path, name, text, problem):
    path = write(tmp_path / name, text)
    with pytest.raises(DataError) as error:
        load_nli_pairs(path)
    assert str(error.value).startswith(f"{path}{problem}")


def test_bad_senteval_files(tmp_path):
    directory = write_senteval(tmp_path / "d", "dev", ["P", "P"], ["H"], ["entailment", "neutral"])
    with pytest.raises(DataError, match=r"s1\.dev: s1/s2/labels\.dev must have equally many lines, got 2/1/2"):
        load_nli_pairs(directory / "s1.dev")
    write_senteval(directory, "test", ["P", "P"], ["H", "H"], ["entailment", "neutrl"])
    with pytest.raises(DataError, match=r"labels\.test:2: unknown label 'neutrl'"):
        load_nli_pairs(directory, split="test")
    with pytest.raises(DataError, match="needs a split"):
        load_nli_pairs(directory)
    with pytest.raises(DataError, match=r"s1\.train: file not found"):
        load_nli_pairs(directory, split="train")


def test_missing_and_undecodable_files(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl: file not found"):
        load_nli_pairs(tmp_path / "nope.jsonl")
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # read, it would wait for a writer forever
    with pytest.raises(DataError, match="fifo.jsonl: not a regular file"):
        load_nli_pairs(fifo)
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"premise": "café"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match="latin1.jsonl: not UTF-8 text"):
        load_nli_pairs(path)


@pytest.mark.skipif(not NLI.is_dir(), reason="needs ../shared/data/nli")
def test_real_nli_triplet_counts_match_sources_md():
    sources = [
        NLI / "generative_nli" / "snli" / "dev.jsonl",
        NLI / "snli_senteval" / "s1.dev",  # the same SNLI dev examples, tokenized
        NLI / "snli_senteval" / "s1.test",
        NLI / "generative_nli" / "mnli" / "dev.jsonl",
        NLI / "generative_nli" / "anli" / "test.jsonl",
        NLI / "sick" / "SICK.txt",
    ]
    triplets, counts = load_nli_triplets(sources)
    assert [(c.pairs, c.skipped_without_gold_label, c.triplets, c.duplicates_dropped) for c in counts] == [
        (9842, 0, 2954, 0),
        (9842, 0, 0, 2954),
        (9824, 0, 2929, 0),
        (9815, 0, 2933, 0),
        (3200, 0, 116, 0),
        (9840, 0, 448, 0),
    ]
    assert len(triplets) == 9380
    assert len(build_triplets(load_nli_pairs(NLI / "snli_senteval", split="dev"))) == 2954
