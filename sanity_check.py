"""Check minBERT against a reference and exit non-zero on any mismatch.

1. The course's check, when both `bert-base-uncased` weights and the course's `sanity_check.data`
   (repo root or ../shared/reference/) are available: the two reference sentences' masked last hidden
   state and pooler output must match within atol 1e-5, rtol 1e-3.
2. Otherwise (e.g. offline): minBERT against Hugging Face `transformers.BertModel` on the same weights
   (default: the bundled `minilm-l6`) on real sentences, masked last hidden state and pooler, atol 1e-5.

    python sanity_check.py [--pretrained NAME_OR_PATH] [--reference FILE]
"""
from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import torch

from base_bert import MINILM_ALIAS, CheckpointError, resolve_pretrained
from bert import BertModel
from minbert.arguments import OneLineErrorParser
from tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parent
REFERENCE_CANDIDATES = (ROOT / "sanity_check.data", ROOT.parent / "shared" / "reference" / "sanity_check.data")
# The course's two sentences, "hello world" and "hello neural world", as bert-base-uncased ids.
COURSE_IDS = torch.tensor([[101, 7592, 2088, 102, 0, 0, 0, 0], [101, 7592, 15756, 2088, 102, 0, 0, 0]])
COURSE_MASK = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
ORACLE_SENTENCES = [
    "hello world",
    "hello neural world",
    "The gorgeously elaborate continuation of The Lord of the Rings trilogy is so huge.",
    "Naïve café-goers don't always know what's on the menu — or do they?",
    "",
]


def compare(name: str, ours: torch.Tensor, reference: torch.Tensor, atol: float, rtol: float) -> bool:
    diff = (ours - reference).abs().max().item()
    ok = torch.allclose(ours, reference, atol=atol, rtol=rtol)
    print(f"  {name:<18} shape {tuple(ours.shape)}  max |diff| {diff:.2e}  {'OK' if ok else 'MISMATCH'}")
    return ok


def masked(outputs: dict, mask: torch.Tensor) -> dict:
    return {"last_hidden_state": outputs["last_hidden_state"] * mask[..., None],
            "pooler_output": outputs["pooler_output"]}


class ReferenceFileError(ValueError):
    """The reference file is missing or not the course's outputs; str() is one line naming it."""


def read_reference(reference_file: Path) -> dict:
    """The course's outputs on COURSE_IDS from `reference_file`, loaded without unpickling; ReferenceFileError
    otherwise (torch's own errors are a traceback, or several lines advising weights_only=False)."""
    if not reference_file.is_file():
        raise ReferenceFileError(f"{reference_file}: file not found" if not reference_file.exists()
                                 else f"{reference_file}: not a file")
    try:
        reference = torch.load(reference_file, map_location="cpu", weights_only=True)
    except OSError as err:
        raise ReferenceFileError(f"{reference_file}: cannot be read ({err.strerror or err})") from None
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, TypeError, AttributeError):
        raise ReferenceFileError(f"{reference_file}: not a torch file of tensors (the course's "
                                 "sanity_check.data), or cut short") from None
    batch = COURSE_IDS.shape
    shapes = {"last_hidden_state": 3, "pooler_output": 2}  # their dimensions; the first ones are COURSE_IDS'
    if not isinstance(reference, dict) or not all(
            isinstance(reference.get(key), torch.Tensor) and reference[key].dim() == dims
            and reference[key].shape[:dims - 1] == batch[:dims - 1] for key, dims in shapes.items()):
        raise ReferenceFileError(f"{reference_file}: not the course's sanity_check.data (last_hidden_state of "
                                 f"shape {tuple(batch)} x hidden and pooler_output of {batch[0]} x hidden)")
    return reference


def course_check(reference_file: Path, pretrained: str = "bert-base-uncased") -> bool:
    print(f"course check: {pretrained} vs {reference_file} (atol 1e-5, rtol 1e-3)")
    reference = read_reference(reference_file)  # before the weights load: a bad file is known without them
    model = BertModel.from_pretrained(pretrained).eval()
    with torch.no_grad():
        ours = masked(model(COURSE_IDS, COURSE_MASK), COURSE_MASK)
    if any(ours[key].shape != reference[key].shape for key in ours):
        raise ReferenceFileError(f"{reference_file}: its outputs' shapes are not {pretrained}'s "
                                 f"({', '.join(f'{key} {tuple(value.shape)}' for key, value in ours.items())})")
    reference = masked(reference, COURSE_MASK)
    return all([compare(k, ours[k], reference[k], 1e-5, 1e-3) for k in ("last_hidden_state", "pooler_output")])


def oracle_check(pretrained: str) -> bool:
    try:
        from transformers import BertModel as ReferenceBert
    except ImportError:
        print("the oracle check needs transformers (a test-only dependency): pip install transformers")
        return False
    directory = resolve_pretrained(pretrained)
    print(f"oracle check: minBERT vs transformers.BertModel on {pretrained} ({directory}), atol 1e-5")
    tokenizer = BertTokenizer.from_pretrained(pretrained)
    batch = tokenizer(ORACLE_SENTENCES, padding=True, truncation=True, return_tensors="pt")
    ours_model = BertModel.from_pretrained(pretrained).eval()
    reference_model = ReferenceBert.from_pretrained(str(directory), add_pooling_layer=True).eval()
    with torch.no_grad():
        ours = masked(ours_model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]),
                      batch["attention_mask"])
        reference = masked(dict(reference_model(**batch)), batch["attention_mask"])
    return all([compare(k, ours[k], reference[k], 1e-5, 0.0) for k in ("last_hidden_state", "pooler_output")])


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrained", default=None,
                        help="weights for the oracle check (default: bert-base-uncased if available, "
                             f"else {MINILM_ALIAS})")
    parser.add_argument("--reference", type=Path, default=None,
                        help="the course's sanity_check.data (its check runs bert-base-uncased only)")
    args = parser.parse_args(argv)
    # The course check runs on bert-base-uncased only: other weights run the oracle check, which reads no reference.
    if args.reference is not None and args.pretrained not in (None, "bert-base-uncased"):
        parser.error(f"--reference would do nothing with --pretrained {args.pretrained}: the course's reference "
                     "checks bert-base-uncased only (other weights are checked against transformers)")

    reference_file = args.reference or next((p for p in REFERENCE_CANDIDATES if p.is_file()), None)
    passed = None
    if args.pretrained in (None, "bert-base-uncased") and reference_file is not None:
        try:
            passed = course_check(reference_file)
        except ReferenceFileError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except CheckpointError as err:
            if args.reference is not None:  # typed, it asks for the course check, not the oracle's in its place
                print(f"error: --reference {args.reference}: the course check needs bert-base-uncased ({err})",
                      file=sys.stderr)
                return 2
            print(f"course check skipped: {err}")
    if passed is None:
        try:
            passed = oracle_check(args.pretrained or MINILM_ALIAS)
        except CheckpointError as err:
            print(f"error: {err}")
            return 2
    print("sanity check passed" if passed else "sanity check FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
