"""A new task is a new file: a toy two-class sentence task, modelled on CFIMDB, written as one module in the
minbert/tasks/ folder of a copy of the repository (nothing else in the copy changed) and trained, evaluated,
predicted, ensembled and distilled through the ordinary command lines, on a tiny random BERT; and a task file that
takes another task's flags, which stops those command lines in one line."""
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LARGEST_SOURCE = 1_000_000  # bytes: a copied file beyond this is data or figures, not source

TOY_TASK = '''"""Toy: whether a sentence is about a cat (1) or not (0); its files are toy-{train,dev,test-student}.csv."""
from minbert.tasks.classification import SentenceClassification

TASK = SentenceClassification(name="toy", order=10, trainable=True, title="Toy", file_prefix="toy", flag_prefix="toy",
                              label_column="label", leaderboard_column="Predicted_Label", num_classes=2,
                              head_name="toy_head")
'''
ANIMALS = ("cat", "dog", "bird", "horse")
PLACES = ("on the mat", "in the garden", "by the door", "under the table", "near the river", "in the house")


def toy_rows(count: int, offset: int) -> list[tuple[str, str, int]]:
    """(id, sentence, label) rows, half of them about cats."""
    rows = []
    for i in range(offset, offset + count):
        animal = ANIMALS[0] if i % 2 else ANIMALS[1 + i % 3]
        rows.append((f"toy{i}", f"the {animal} sleeps {PLACES[i % len(PLACES)]} number {i}", int(animal == "cat")))
    return rows


def write_toy_file(path: Path, rows, labelled: bool) -> None:
    """The course's layout: an unnamed index column, id, sentence (and the label), tab-separated."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["", "id", "sentence", *(["label"] if labelled else [])])
        for index, (example_id, sentence, label) in enumerate(rows):
            writer.writerow([index, example_id, sentence, *([label] if labelled else [])])


def copy_of_the_repository(destination: Path) -> Path:
    """The repository's source as git knows it (tracked, and new files not ignored) without results/ or large
    files."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no list of the repository's files to copy")
    for name in listed.stdout.splitlines():
        source = ROOT / name
        if name.startswith("results/") or not source.is_file() or source.stat().st_size > LARGEST_SOURCE:
            continue
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination / name)
    return destination


@pytest.mark.slow
def test_a_new_task_is_one_new_file(tmp_path, tiny_checkpoint):
    repo = copy_of_the_repository(tmp_path / "repo")
    (repo / "minbert" / "tasks" / "toy.py").write_text(TOY_TASK)
    data = tmp_path / "data"
    data.mkdir()
    write_toy_file(data / "toy-train.csv", toy_rows(24, 0), labelled=True)
    write_toy_file(data / "toy-dev.csv", toy_rows(12, 100), labelled=True)
    write_toy_file(data / "toy-test-student.csv", toy_rows(12, 200), labelled=False)
    dev_ids = [example_id for example_id, _, _ in toy_rows(12, 100)]
    runs = tmp_path / "runs"
    # The copy's own package, not the installed one (`pip install -e .` points at this checkout) for its scripts/
    environment = os.environ | {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}

    def command(script: str, *flags) -> list[str]:
        return [sys.executable, str(repo / script), *map(str, flags)]

    def train(name: str, *extra) -> list[str]:
        out = runs / name
        return command("multitask_classifier.py", "--tasks", "toy", "--data_dir", data, "--pretrained",
                       tiny_checkpoint, "--option", "finetune", "--quiet", "--precision", "fp32", "--max_length", 32,
                       "--batch_size", 8, "--lr", "1e-3", "--output_dir", out, "--toy_dev_out",
                       out / "toy-dev-out.csv", "--toy_test_out", out / "toy-test-out.csv", *extra)

    def finished(process: subprocess.Popen) -> str:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        return out

    def run(argv: list[str]) -> str:
        return finished(subprocess.Popen(argv, cwd=repo, env=environment, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))

    # Two members trained at once (one core each), each saving the scores an ensemble and a student read.
    members = [subprocess.Popen(train(name, "--score_train", "--seed", seed), cwd=repo, env=environment,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, seed in (("a", 0), ("b", 1))]
    for process in members:
        finished(process)
    for name in ("a", "b"):
        with (runs / name / "toy-dev-out.csv").open() as handle:
            rows = list(csv.reader(handle))
        assert rows[0] == ["id", "Predicted_Label"] and sorted(row[0] for row in rows[1:]) == sorted(dev_ids)
        assert {row[1] for row in rows[1:]} <= {"0", "1"}
        assert (runs / name / "toy-test-out.csv").is_file()
        for split in ("dev", "test", "train"):
            header = (runs / name / "scores" / f"toy-{split}.csv").read_text().splitlines()[0]
            assert header == "id,logit_0,logit_1"
        assert '"toy_acc"' in (runs / name / "best.json").read_text()  # evaluated on dev, and kept by it

    ensemble = run(command("scripts/ensemble.py", runs / "a", runs / "b", "--output_dir", runs / "ensemble",
                           "--data_dir", data, "--toy", "mean", "--score_train"))
    assert "toy: members on dev" in ensemble and (runs / "ensemble" / "toy-dev-out.csv").is_file()
    assert (runs / "ensemble" / "scores" / "toy-train.csv").is_file()

    student = run(train("student", "--distill", runs / "ensemble", "--distill_temperature", 2))
    assert f"distillation: the train scores of toy from {runs / 'ensemble'}" in student
    assert (runs / "student" / "toy-test-out.csv").is_file()


def test_a_task_file_taking_another_tasks_flags_stops_each_command_line_in_one_line(tmp_path):
    """The registry refuses the collision while the package is imported, before any command line's own handler."""
    repo = copy_of_the_repository(tmp_path / "repo")
    (repo / "minbert" / "tasks" / "toy.py").write_text(TOY_TASK.replace('flag_prefix="toy"', 'flag_prefix="para"'))
    environment = os.environ | {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    scripts = ("multitask_classifier.py", "classifier.py", "scripts/ensemble.py")
    started = [subprocess.Popen([sys.executable, str(repo / script), "--help"], cwd=repo, env=environment,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for script in scripts]
    for script, process in zip(scripts, started):
        out, err = process.communicate(timeout=120)
        assert (process.returncode, out) == (2, ""), script
        assert err == ("error: minbert/tasks/toy.py: its flag '--para_train' is already minbert/tasks/qqp.py's; two "
                       "tasks cannot share it\n"), script
