"""The CPU recipe scripts (the commands behind RESULTS.md's rows) run end to end on the demo data, each
cut to a few examples: a recipe that no longer matches the command line fails here, not after hours."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--max_train_examples", "16", "--max_length", "32", "--quiet"]
RECIPES = {  # recipe -> (extra flags that keep it short, environment)
    "cpu_sbert.sh": (["--cycles", "1"], {}),
    "cpu_ss.sh": (["--cycles", "1"], {}),
    "cpu_annealed.sh": (["--epochs", "1"], {}),
    "cpu_adapters.sh": (["--cycles", "1"], {"ADAPTER": "dora"}),
    "cpu_single_task.sh": ([], {"TASKS": "sts"}),
    "cpu_simcse_sbert.sh": (["--cycles", "1", "--simcse_max_examples", "16"], {}),
    "cpu_sss.sh": (["--cycles", "1", "--simcse_max_examples", "16"], {}),
}
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_cpu_recipe_runs_on_the_demo_data(recipe):
    flags, environment = RECIPES[recipe]
    if "simcse" in recipe or "sss" in recipe:
        if not (ROOT.parent / "shared" / "data" / "nli").is_dir():
            pytest.skip("the SimCSE recipes read ../shared/data/nli")
    name = f"test_recipe_{recipe.removesuffix('.sh')}"
    env = {**os.environ, "DATA_DIR": str(ROOT / "data" / "demo"), "RUN_NAME": name, "OMP_NUM_THREADS": "1",
           **environment}
    try:
        result = subprocess.run(["bash", str(ROOT / "scripts" / recipe), *SHORT, *flags], env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        written = list((ROOT / "runs").glob(f"{name}*/predictions/*-out.csv"))
        assert len(written) == 6 * (1 if "single" not in recipe else len(environment["TASKS"].split()))
    finally:
        for run in (ROOT / "runs").glob(f"{name}*"):
            shutil.rmtree(run, ignore_errors=True)
