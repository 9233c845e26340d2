"""`.ci/check_imports.py`: every module the repository imports comes from a declared package; CI runs it in a new
virtual environment before the tests, so a package installed by hand on the machine cannot hide a missing line."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT / ".ci" / "check_imports.py"


def load_checker():
    spec = importlib.util.spec_from_file_location("check_imports", CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_repo(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    return tmp_path


def run_checker(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECKER), str(root)], capture_output=True, text=True)


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="the check reads git's list of tracked files")
def test_every_import_of_the_repository_is_declared():
    assert load_checker().undeclared_imports(ROOT) == []


def test_ci_runs_the_check_in_a_new_environment_before_the_tests():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "-m venv" in ci and "unset PYTHONPATH" in ci
    assert ci.index("python .ci/check_imports.py") < ci.index("python -m pytest")


def test_an_import_that_arrives_only_through_another_package_fails_in_one_line(tmp_path):
    pytest.importorskip("sqlalchemy")  # installed as optuna's dependency and as the sweep's declared one
    root = make_repo(tmp_path, {"requirements.txt": "optuna>=5.0\n", "tool.py": "import optuna\nimport sqlalchemy\n"})
    result = run_checker(root)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "undeclared import: sqlalchemy (tool.py:2) comes from SQLAlchemy, which no requirements file or "
        "pyproject.toml names"]


def test_imports_by_name_and_notebook_cells_are_checked_and_local_modules_are_not(tmp_path):
    notebook = {"cells": [{"cell_type": "code", "source": ["%pip install x\n", "import nb_only_module_xyz\n"]}]}
    root = make_repo(tmp_path, {
        "pyproject.toml": '[project]\nname = "p"\ndependencies = ["numpy>=1"]\n'
                          '[project.optional-dependencies]\nextra = ["pytest"]\n',
        "helper.py": "import numpy\n",
        "tests/test_x.py": "import pytest\nimport helper\nimport test_y\nbad = pytest.importorskip('skip_only_xyz')\n",
        "tests/test_y.py": "from importlib import import_module\nimport_module('dynamic_only_xyz.sub')\n",
        "nb.ipynb": json.dumps(notebook)})
    result = run_checker(root)
    assert result.returncode == 1
    named = [line.split()[2] for line in result.stderr.splitlines()]
    assert named == ["dynamic_only_xyz", "nb_only_module_xyz", "skip_only_xyz"]


def test_a_declared_repository_passes(tmp_path):
    root = make_repo(tmp_path, {"requirements.txt": "-e .\nnumpy>=1  # why\n", "a.py": "import os\nimport numpy\n"})
    result = run_checker(root)
    assert (result.returncode, result.stderr) == (0, "")
