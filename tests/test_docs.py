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


# An input a command names by a placeholder (DIR, RUN, …) or that a run writes (runs/...) is the reader's to supply.
INPUT_FLAGS = r"--(?:input|space|enqueue) ([^\s`)]+)"


def named_inputs(page: Path) -> list[str]:
    return [path for path in re.findall(INPUT_FLAGS, page.read_text(encoding="utf-8"))
            if path != "-" and "…" not in path and not path.startswith("runs/")
            and not re.search(r"(^|/)[A-Z][A-Z_]+(/|$)", path)]


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_input_file_a_command_names_exists(page):
    """Issue 59: the README's predict.py and sweep examples read pairs.txt, new-pairs.jsonl and space.json, which did
    not exist: a command copied from the front page must work (the small inputs live in examples/)."""
    assert not [path for path in named_inputs(page) if not (ROOT / path).is_file()]


def test_the_input_check_sees_a_missing_file(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("python predict.py runs/demo --task sts --input pairs.txt\n`--input DIR/x.csv` `--space "
                    "examples/space.json` `--input runs/demo/x.csv` `--input …/perturbed/a.csv`\n", encoding="utf-8")
    assert named_inputs(page) == ["pairs.txt", "examples/space.json"]


def readme_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


@pytest.fixture(scope="module")
def readme_folder(tiny_checkpoint, tmp_path_factory):
    """A folder laid out as the README's commands expect: the project's scripts and examples/, and runs/demo and
    runs/gpu_ss a tiny run of the three tasks (the demo itself takes minutes)."""
    import multitask_classifier
    from conftest import DEMO, skip_figures
    folder = tmp_path_factory.mktemp("readme")
    run = folder / "tiny-run"
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        assert multitask_classifier.main([
            "--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
            "--max_train_examples", "16", "--max_length", "32", "--batch_size", "8", "--lr", "1e-3",
            "--first_stages", "qqp,sts,sst", "--cycles", "0", "--output_dir", str(run)]) == 0
    (folder / "runs").mkdir()
    for name in ("demo", "gpu_ss"):
        (folder / "runs" / name).symlink_to(run)
    for name in ("predict.py", "examples"):
        (folder / name).symlink_to(ROOT / name)
    return folder


def test_the_readme_predict_commands_run_as_written(readme_folder):
    """Each predict.py line of the README, as written (runs/demo: a tiny run), gives JSON lines with the label, the
    probabilities by class name and the task's raw score."""
    import json
    import os
    import subprocess
    import sys
    commands = [line for block in readme_blocks("bash") for line in block.splitlines() if "predict.py" in line]
    assert len(commands) == 3, commands
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ['PATH']}"}
    for command in commands:
        result = subprocess.run(["bash", "-c", command], cwd=readme_folder, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, (command, result.stderr)
        output = re.search(r"--output (\S+)", command)
        text = (readme_folder / output.group(1)).read_text() if output else result.stdout
        records = [json.loads(line) for line in text.splitlines()]
        assert records and all("label" in record for record in records)
        assert all(("logits" in r or "logit" in r or "score" in r) for r in records)


def test_the_readme_python_api_snippet_runs(readme_folder, monkeypatch):
    (snippet,) = [block for block in readme_blocks("python") if "load_run" in block]
    monkeypatch.chdir(readme_folder)
    namespace = {}
    exec(snippet, namespace)  # noqa: S102 (the README's own code)
    labels = namespace["run"].predict(["A gripping film."], task="sst").label_names
    assert labels[0] in ("negative", "somewhat negative", "neutral", "somewhat positive", "positive")
