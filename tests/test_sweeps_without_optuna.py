"""minbert/sweeps/ (scripts/sweep.py's engine) imports Optuna and SQLAlchemy only when a sweep runs: the package and
the script import without them, and the script without Optuna says so in one line, exit code 2. These run in a
child process where both are unimportable, whether or not this environment has them."""
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP_MODULES = sorted(f"minbert.sweeps.{path.stem}" for path in (ROOT / "minbert" / "sweeps").glob("*.py")
                       if path.stem != "__init__")


def without_optuna(code: str) -> subprocess.CompletedProcess:
    blocked = 'import sys\nsys.modules.update(optuna=None, sqlalchemy=None)\nsys.path.insert(0, "scripts")\n'
    return subprocess.run([sys.executable, "-c", blocked + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True)


def test_the_sweep_package_and_script_import_without_optuna_or_sqlalchemy():
    assert {"minbert.sweeps.study", "minbert.sweeps.trials", "minbert.sweeps.summary"} <= set(SWEEP_MODULES)
    result = without_optuna("import importlib\n" + "".join(f"importlib.import_module({name!r})\n"
                                                           for name in [*SWEEP_MODULES, "sweep"]))
    assert (result.returncode, result.stderr) == (0, "")


def test_the_script_without_optuna_refuses_in_one_line(tmp_path):
    result = without_optuna(f"""
        import sweep
        sys.exit(sweep.main(["--study", "s", "--space", "space.json", "--sweeps_dir", {str(tmp_path)!r}]))
    """)
    assert result.returncode == 2
    assert result.stderr == "error: scripts/sweep.py needs Optuna: pip install optuna (requirements.txt)\n"
    assert not list(tmp_path.iterdir())
