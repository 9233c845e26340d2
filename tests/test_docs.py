"""README.md is the front page (what a newcomer needs, at most 10 KB) and docs/ holds one page per topic: the
README keeps the set-up and test commands CI runs, the demo and the Colab link, and every relative link in README.md,
RESULTS.md and docs/*.md points at a file (and heading) that exists, as does every script their commands run.
RESULTS.md is the results' front page (the thesis' two questions first, at most ~300 lines) and links every
study's page under docs/results/."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULT_PAGES = sorted((ROOT / "docs" / "results").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "RESULTS.md", ROOT / "BENCHMARKS.md", ROOT / "results" / "README.md",
         *sorted((ROOT / "docs").glob("*.md")), *RESULT_PAGES]


def github_anchor(heading):
    """The id GitHub gives a heading: lower case, punctuation dropped (word characters, '-' and ' ' kept),
    spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page):
    found, seen, in_code = set(), {}, False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else re.match(r"#{1,6} (.*)", line)
        if heading:
            anchor = github_anchor(heading.group(1))
            found.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
            seen[anchor] = seen.get(anchor, 0) + 1
    return found


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 10_000
    for kept in ("pip install -r requirements.txt -r requirements-dev.txt", "python -m pytest -q",
                 "python multitask_classifier.py --demo", "notebooks/colab.ipynb", "## Layout"):
        assert kept in text, kept
    assert "python -m pytest -q" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_flag_table_lives_in_one_page():
    pages = [p for p in PAGES if "| group | flags |" in p.read_text(encoding="utf-8")]
    assert pages == [ROOT / "docs" / "command_line.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_a_command_runs_exists(page):
    """A command quoted beside a figure names the script that reruns it: one moved since (ensemble.py became
    scripts/ensemble.py) leaves the figure with no command that works."""
    scripts = re.findall(r"(?:python|bash) ([\w./-]+\.(?:py|sh))\b", page.read_text(encoding="utf-8"))
    assert scripts or page.name not in ("RESULTS.md", "BENCHMARKS.md")
    assert not [script for script in scripts if not (ROOT / script).is_file()]


def relative_links(page):
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))
            if not re.match(r"[a-z]+:", target)]


def test_results_is_a_front_page_answering_the_thesis_first():
    text = (ROOT / "RESULTS.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    first_screen = "\n".join(text.splitlines()[:60])
    for kept in ("Does SMART keep the model from forgetting?", "Does SMART make the model robust?",
                 "exact permutation"):
        assert kept in first_screen, kept
    for section in ("## Thesis claim → what we found here", "## Key results", "## Limitations", "## Contents"):
        assert text.count(section) == 1, section


def test_every_study_page_is_linked_from_the_front_page_and_exists():
    """A page moved out of RESULTS.md that its contents do not link is lost to a reader; a contents entry whose page
    was renamed is a dead end."""
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in relative_links(ROOT / "RESULTS.md")
              if target.startswith("docs/results/")}
    assert RESULT_PAGES and {page.resolve() for page in RESULT_PAGES} <= linked
    assert all(path.exists() for path in linked)


def test_the_front_page_figure_has_its_command_beside_it():
    text = (ROOT / "RESULTS.md").read_text(encoding="utf-8")
    assert "](docs/results/studies.png)" in text
    assert "python scripts/plot_studies.py --out docs/results/studies.png" in text
