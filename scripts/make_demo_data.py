"""Write the synthetic demo data in data/demo/ (same file names and formats as the course files and
the official SQuAD 2.0 files).

    python scripts/make_demo_data.py [--out_dir data/demo] [--seed 0]

Every sentence is built from templates and small word lists written for this project (minbert/data/demo.py and
demo_squad.py), so the labels are known by construction: SST polarity from the strength of the wording, CFIMDB from
the review's tone, Quora duplicates from paraphrase templates of one question, STS similarity from how
many parts of a described scene (who, doing what, where) two sentences share, SQuAD answers from the
fact sentences of articles about invented towns (a question is unanswerable when its paragraph lacks
that fact or names another town). The output is deterministic for a given seed; the committed files
come from seed 0 (the SQuAD files draw from their own generator, so they leave the CSVs unchanged).
"""
from __future__ import annotations

from pathlib import Path

from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.data.demo import write_demo_data


def main(argv: list[str] | None = None) -> None:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "demo")
    parser.add_argument("--seed", type=rng_seed, default=0)
    args = parser.parse_args(argv)
    write_demo_data(args.out_dir, args.seed)
    print(f"wrote the demo data to {args.out_dir}")


if __name__ == "__main__":
    main()
