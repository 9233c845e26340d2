"""NLI data for the SimCSE stage: labelled (premise, hypothesis) pairs read from JSON Lines, SentEval, SICK or
triplet CSV files (see load_nli_pairs), and the (anchor, positive, hard negative) triplets made from them by
pairing, per premise, its entailment hypotheses with its contradiction hypotheses, one to one or every one with every
one (simcse.py trains on them).
"""

import csv
import io
import itertools
import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from minbert.files import DataError, DataWarning, read_input_bytes, text_lines

LABELS = ("entailment", "neutral", "contradiction")
# The Hugging Face SNLI/MultiNLI datasets store labels as these integers, -1 for "no gold label".
_INTEGER_LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}
_NO_GOLD_LABELS = ("-", -1)
_TRIPLET_HEADERS = (("premise", "positive", "negative"), ("sent0", "sent1", "hard_neg"))
_SICK_COLUMNS = ("sentence_A", "sentence_B", "entailment_label")
PAIRINGS = ("zip", "product")  # how a premise's entailments and contradictions become triplets (build_triplets)


class NLIPair(NamedTuple):
    premise: str
    hypothesis: str
    label: str  # one of LABELS


class NLITriplet(NamedTuple):
    anchor: str  # the premise
    positive: str  # a hypothesis it entails
    negative: str  # a hypothesis it contradicts


@dataclass(frozen=True)
class NLISourceCounts:
    """What load_nli_triplets took from one source."""

    path: str
    pairs: int
    skipped_without_gold_label: int
    triplets: int
    duplicates_dropped: int

    def __str__(self) -> str:
        return (
            f"{self.path}: {self.pairs} pairs ({self.skipped_without_gold_label} without gold label skipped), "
            f"{self.triplets} triplets, {self.duplicates_dropped} duplicates dropped"
        )


def _read_text(path: Path) -> str:
    try:
        return read_input_bytes(path).decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(path, f"not UTF-8 text ({error.reason} at byte {error.start})") from None


def _label(raw: object, path: Path, line: int) -> str | None:
    """The normalised label, or None for an example without a gold label."""
    if not isinstance(raw, bool):  # True == 1 would otherwise read as "neutral"
        if raw in _NO_GOLD_LABELS:
            return None
        if isinstance(raw, int) and raw in _INTEGER_LABELS:
            return _INTEGER_LABELS[raw]
        if isinstance(raw, str) and raw.strip().lower() in LABELS:
            return raw.strip().lower()
    raise DataError(path, f"unknown label {raw!r}, expected one of {list(LABELS)}", line)


def _text(raw: object, field: str, path: Path, line: int) -> str:
    if not isinstance(raw, str):
        raise DataError(path, f"field {field!r} must be a string, got {raw!r}", line)
    return raw.strip()


def _read_jsonl(path: Path) -> tuple[list[NLIPair], list[int]]:
    pairs, unlabelled = [], []
    for number, line in enumerate(text_lines(_read_text(path)), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(path, f"invalid JSON ({error.msg})", number) from None
        if not isinstance(record, dict):
            raise DataError(path, f"expected a JSON object, got {type(record).__name__}", number)
        # The unified files use premise/hypothesis/label, the original snli_1.0 files sentence1/sentence2/gold_label.
        fields = ("premise", "hypothesis", "label") if "premise" in record else ("sentence1", "sentence2", "gold_label")
        missing = [field for field in fields if field not in record]
        if missing:
            raise DataError(path, f"missing field {missing[0]!r} (expected {', '.join(fields)})", number)
        label = _label(record[fields[2]], path, number)
        if label is None:
            unlabelled.append(number)
            continue
        premise, hypothesis = (_text(record[field], field, path, number) for field in fields[:2])
        pairs.append(NLIPair(premise, hypothesis, label))
    return pairs, unlabelled


def _read_senteval(s1_path: Path) -> tuple[list[NLIPair], list[int]]:
    split = s1_path.name.removeprefix("s1.")
    label_path = s1_path.with_name(f"labels.{split}")
    columns = [text_lines(_read_text(s1_path.with_name(f"{prefix}.{split}"))) for prefix in ("s1", "s2", "labels")]
    lengths = [len(column) for column in columns]
    if len(set(lengths)) != 1:
        counts = "/".join(map(str, lengths))
        raise DataError(s1_path, f"s1/s2/labels.{split} must have equally many lines, got {counts}")
    pairs, unlabelled = [], []
    for number, (premise, hypothesis, raw_label) in enumerate(zip(*columns), start=1):
        label = _label(raw_label.strip(), label_path, number)
        if label is None:
            unlabelled.append(number)
            continue
        pairs.append(NLIPair(premise.strip(), hypothesis.strip(), label))
    return pairs, unlabelled


def _read_sick(path: Path) -> tuple[list[NLIPair], list[int]]:
    lines = text_lines(_read_text(path))
    header = lines[0].split("\t") if lines else []
    missing = [column for column in _SICK_COLUMNS if column not in header]
    if missing:
        raise DataError(path, f"not a SICK header, missing column {missing[0]!r}", 1)
    premise_at, hypothesis_at, label_at = (header.index(column) for column in _SICK_COLUMNS)
    pairs = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(path, f"expected {len(header)} tab-separated fields, got {len(fields)}", number)
        label = _label(fields[label_at].strip(), path, number)
        if label is None:  # every SICK pair has a gold label, so "-" means a broken file
            raise DataError(path, "entailment_label is missing", number)
        pairs.append(NLIPair(fields[premise_at].strip(), fields[hypothesis_at].strip(), label))
    return pairs, []


def _read_triplet_csv(path: Path) -> tuple[list[NLIPair], list[int]]:
    # newline="" keeps quoted fields with line breaks intact, so rows.line_num is the physical line.
    rows = csv.reader(io.StringIO(_read_text(path), newline=""))
    try:
        header = tuple(field.strip() for field in next(rows, []))
        if header not in _TRIPLET_HEADERS:
            expected = " or ".join(",".join(h) for h in _TRIPLET_HEADERS)
            raise DataError(path, f"expected header {expected}, got {','.join(header) or 'an empty file'}", 1)
        pairs = []
        for row in rows:
            if not any(field.strip() for field in row):
                continue
            if len(row) != 3:
                raise DataError(path, f"expected 3 comma-separated fields, got {len(row)}", rows.line_num)
            premise, positive, negative = (field.strip() for field in row)
            pairs += [NLIPair(premise, positive, "entailment"), NLIPair(premise, negative, "contradiction")]
    except csv.Error as error:
        raise DataError(path, f"malformed CSV ({error})", rows.line_num) from None
    return pairs, []


def _read_nli_source(path: str | Path, split: str | None = None) -> tuple[list[NLIPair], int]:
    """(pairs, number of examples skipped for lacking a gold label, which a DataWarning also reports)."""
    path = Path(path)
    if path.is_dir():
        if split is None:
            raise DataError(path, "a SentEval directory needs a split (or pass its s1.<split> file)")
        path = path / f"s1.{split}"
    elif split is not None:
        raise DataError(path, f"split {split!r} applies to SentEval directories only")
    if path.name.startswith("s1."):
        pairs, unlabelled = _read_senteval(path)
    elif path.suffix == ".jsonl":
        pairs, unlabelled = _read_jsonl(path)
    elif path.suffix == ".csv":
        pairs, unlabelled = _read_triplet_csv(path)
    elif path.suffix == ".txt":
        pairs, unlabelled = _read_sick(path)
    else:
        raise DataError(
            path,
            "unrecognised NLI source (expected .jsonl, a premise,positive,negative .csv, SICK .txt, "
            "a SentEval s1.<split> file or a SentEval directory with a split)",
        )
    if unlabelled:
        shown = ", ".join(map(str, unlabelled[:10])) + (", ..." if len(unlabelled) > 10 else "")
        message = f"{path}: skipped {len(unlabelled)} example(s) without a gold label (lines {shown})"
        warnings.warn(message, DataWarning, stacklevel=3)
    return pairs, len(unlabelled)


def load_nli_pairs(path: str | Path, split: str | None = None) -> list[NLIPair]:
    """Labelled NLI pairs, in file order, from any of these sources:

    - JSON Lines (.jsonl): {premise, hypothesis, label} or snli_1.0's {sentence1, sentence2, gold_label};
      examples whose gold label is "-" (or -1) are skipped with a DataWarning giving the count.
    - SentEval (s1.X, s2.X, labels.X, one example per line): the s1.X file, or the directory and split="X".
    - SICK (.txt, tab-separated with header): sentence_A is the premise, entailment_label the label.
    - Triplet CSV (.csv) with header premise,positive,negative (or SimCSE's sent0,sent1,hard_neg): each
      row becomes an entailment and a contradiction pair, which build_triplets' "zip" joins back unchanged.

    Labels come back lower case, texts stripped. Anything malformed raises minbert.files.DataError
    ("path:line: problem").
    """
    return _read_nli_source(path, split)[0]


def build_triplets(pairs: Iterable[NLIPair], pairing: str = "zip") -> list[NLITriplet]:
    """Each premise's entailment hypotheses paired with its contradiction hypotheses, premises in order of first
    appearance, by `pairing` (PAIRINGS): "zip", the i-th entailment with the i-th contradiction, both in input order
    (min(#entailment, #contradiction) triplets per premise); or "product", every entailment with every contradiction
    (#entailment x #contradiction), entailments outermost, as the thesis' listing B.1 merges SNLI on the premise."""
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown pairing {pairing!r}, expected one of {PAIRINGS}")
    hypotheses: dict[str, tuple[list[str], list[str]]] = {}
    for pair in pairs:
        entailed, contradicted = hypotheses.setdefault(pair.premise, ([], []))
        if pair.label == "entailment":
            entailed.append(pair.hypothesis)
        elif pair.label == "contradiction":
            contradicted.append(pair.hypothesis)
    pair_up = zip if pairing == "zip" else itertools.product
    return [
        NLITriplet(premise, positive, negative)
        for premise, (entailed, contradicted) in hypotheses.items()
        for positive, negative in pair_up(entailed, contradicted)
    ]


def _duplicate_key(triplet: NLITriplet) -> tuple[str, ...]:
    # SentEval's copy of SNLI is tokenized ("packages ." and ``quotes''); the original text is not.
    # Dropping whitespace and unifying quotes makes both copies of an example compare equal.
    return tuple(re.sub(r"\s+", "", text.replace("``", '"').replace("''", '"')).casefold() for text in triplet)


def load_nli_triplets(
    paths: Iterable[str | Path], dedupe: bool = True, pairing: str = "zip"
) -> tuple[list[NLITriplet], list[NLISourceCounts]]:
    """Triplets from several sources (each as for load_nli_pairs; SentEval as its s1.X file), in order, each source's
    pairs made triplets by build_triplets' `pairing`.

    With dedupe, a triplet equal to an earlier one up to tokenization, whitespace and case is dropped,
    so the same data present twice (SNLI dev as SentEval and as JSONL) counts once; the first copy
    wins, so list untokenized sources first. Returns the triplets and per-source counts.
    """
    triplets: list[NLITriplet] = []
    counts: list[NLISourceCounts] = []
    seen: set[tuple[str, ...]] = set()
    for path in paths:
        pairs, skipped = _read_nli_source(path)
        kept, dropped = [], 0
        for triplet in build_triplets(pairs, pairing):
            key = _duplicate_key(triplet)
            if dedupe and key in seen:
                dropped += 1
                continue
            seen.add(key)
            kept.append(triplet)
        triplets += kept
        counts.append(NLISourceCounts(str(path), len(pairs), skipped, len(kept), dropped))
    return triplets, counts
