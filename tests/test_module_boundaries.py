"""The seams between the project's modules, read from their import statements and syntax: the package's layers
(minbert/__init__.py) import only the layers below them, no import cycle, library modules never import a command
line, the seam between the course's top-level files and the package points one way, no module outside minbert/tasks/
tests a task's name (it asks the task), and the test-only oracles (transformers, sentence-transformers, peft) stay
out of training and prediction."""
import ast
from pathlib import Path

import pytest

from minbert.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minbert"


def module_name(path: Path) -> str:
    """'minbert/training/trainer.py' -> 'minbert.training.trainer'; a package's __init__.py is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# The course's files at the top level and the package's modules, by dotted name; scripts/*.py are command lines.
MODULES = {module_name(path): path for path in [*ROOT.glob("*.py"), *PACKAGE.rglob("*.py")]}
COMMAND_LINES = {"multitask_classifier", "classifier", "prepare_submit", "sanity_check", "optimizer_test",
                 *(path.stem for path in ROOT.glob("scripts/*.py"))}
# The package's layers, lowest first (minbert/__init__.py): a module imports its own layer and those before it.
LAYERS = ("core", "tasks", "data", "model", "prediction", "reports", "robustness", "training", "run",
          "sweeps", "benchmarks")
# The course's building blocks: the package builds on them, so they import nothing from it.
BUILDING_BLOCKS = {"bert", "base_bert", "optimizer", "smart", "tokenizer"}
ORACLES = {"transformers", "sentence_transformers", "peft"}
# The benchmarks time the project against transformers, imported inside the functions that do.
ORACLE_USERS = {ROOT / "sanity_check.py", PACKAGE / "benchmarks" / "models.py",
                PACKAGE / "benchmarks" / "qa_peer.py"}
# The package's front door (minbert/__init__.py) names the top layer's Python API, imported on first use (a module
# __getattr__): `from minbert import load_run`. Its only exception to the layer rule.
FRONT_DOOR = {"minbert": {"minbert.run.trained_run"}}
TASK_NAMES = {name for task in TASKS.values() for name in (task.name, *task.aliases)}


def imported_modules(path: Path, for_types: bool = False) -> set[str]:
    """The dotted names of every module `path` imports, in functions too, and under `if TYPE_CHECKING:` only with
    `for_types`; `from a.b import c` gives a.b and, where c is a module of the project, a.b.c."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_checking = set() if for_types else {
        id(node) for branch in ast.walk(tree) if isinstance(branch, ast.If)
        and getattr(branch.test, "id", None) == "TYPE_CHECKING" for node in ast.walk(branch)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names} & MODULES.keys()
    return names


def project_imports(path: Path, for_types: bool = False) -> set[str]:
    return imported_modules(path, for_types) & MODULES.keys()


def layer(module: str) -> str | None:
    """A package module's layer ('minbert.training.trainer' -> 'training'; the package's own files are 'core')."""
    parts = module.split(".")
    if parts[0] != "minbert":
        return None
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "core"


def test_every_package_folder_is_a_layer():
    assert {layer(name) for name in MODULES} - {None} == set(LAYERS)


def test_each_layer_imports_only_the_layers_below_it():
    for name, path in MODULES.items():
        if layer(name) is None:
            continue
        above = {imported for imported in project_imports(path) - FRONT_DOOR.get(name, set())
                 if layer(imported) and LAYERS.index(layer(imported)) > LAYERS.index(layer(name))}
        assert not above, f"{path.relative_to(ROOT)} ({layer(name)}) imports a layer above it: {sorted(above)}"


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle of `graph` (module -> the modules it imports) as a path back to its start, or None."""
    done, active = set(), []

    def visit(name: str) -> list[str] | None:
        if name in active:
            return active[active.index(name):] + [name]
        if name in done:
            return None
        active.append(name)
        cycle = next(filter(None, (visit(imported) for imported in sorted(graph[name]))), None)
        active.pop()
        done.add(name)
        return cycle
    return next(filter(None, (visit(module) for module in sorted(graph))), None)


def test_the_modules_import_each_other_without_a_cycle():
    """Imports for type annotations only (under `if TYPE_CHECKING:`) count: two modules that each need the other
    are one module's job split in two, whether Python would fail to import them or not."""
    cycle = import_cycle({name: project_imports(path, for_types=True) - {name} for name, path in MODULES.items()})
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_sees_a_type_only_import(tmp_path):
    module = tmp_path / "settings.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from minbert.run.run_setup import x\n")
    assert imported_modules(module) == {"typing"}
    assert "minbert.run.run_setup" in imported_modules(module, for_types=True)
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_front_door_imports_the_api_only_when_asked():
    """`import minbert` loads no layer and no torch: the API's module comes in at the first `minbert.load_run`."""
    import subprocess
    import sys
    code = ("import sys, minbert; assert 'torch' not in sys.modules and 'minbert.run' not in sys.modules; "
            "from minbert import load_run; assert load_run.__module__ == 'minbert.run.trained_run'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_library_modules_never_import_a_command_line():
    for name, path in MODULES.items():
        if name not in COMMAND_LINES:
            assert not project_imports(path) & COMMAND_LINES, f"{path.relative_to(ROOT)} imports a command line"


def test_scripts_never_import_another_command_line():
    """A script that trains as multitask_classifier.py does shares its library code (minbert.run)."""
    for path in ROOT.glob("scripts/*.py"):
        assert not imported_modules(path) & COMMAND_LINES, f"{path.relative_to(ROOT)} imports a command line"


def seam_crossings(modules: dict[str, Path]) -> list[str]:
    """Where the imports between the course's top-level files and the package point both ways: a building block
    that imports the package, or a course file that imports the package and that the package imports, directly or
    through other course files (through such a file a module reaches any layer, its own rules unchecked)."""
    imports = {name: imported_modules(path) & modules.keys() for name, path in modules.items()}
    package = {name for name in modules if layer(name)}
    crossings = [f"{name}.py, a building block, imports {sorted(imported & package)}"
                 for name, imported in imports.items() if name in BUILDING_BLOCKS and imported & package]
    reached = set(package)  # the package and every course file it imports, directly or not
    while new := {imported for name in reached for imported in imports[name]} - reached:
        reached |= new
    for name, imported in imports.items():
        importers = sorted(user for user in reached if name in imports[user])
        if layer(name) is None and name not in BUILDING_BLOCKS and imported & package and importers:
            crossings.append(f"{name}.py imports {sorted(imported & package)} and is imported by {importers}")
    return crossings


def test_the_seam_between_the_course_files_and_the_package_points_one_way():
    """The package builds on the course's building blocks, and the course's other files (evaluation.py, simcse.py,
    datasets.py, the command lines) build on the package: no import runs back up."""
    crossings = seam_crossings(MODULES)
    assert not crossings, "\n".join(crossings)


def test_the_seam_check_can_fail(tmp_path):
    """The three crossings the seam had (issue 45): bert.py importing minbert.runtime, and evaluation.py and
    simcse.py each importing the package and imported by it; and a course file that the package reaches through a
    building block. datasets.py and the command lines, which the package never imports, pass."""
    sources = {"bert": "from base_bert import BertConfig\nfrom minbert.runtime import host_indices\n",
               "base_bert": "import torch\n",
               "evaluation": "from minbert.tasks import TASKS\n",
               "simcse": "def losses():\n    from minbert.runtime import float32_exact\n",
               "datasets": "from minbert.data.batches import load_split\n",
               "multitask_classifier": "import evaluation\nfrom minbert.run import run_setup\n",
               "minbert.reports.plots": "from evaluation import error_counts\nfrom bert import BertModel\n",
               "minbert.run.run_setup": "import simcse\nimport bert\nimport smart\n",
               "smart": "from helpers import clip\n", "helpers": "from minbert.runtime import autocast\n",
               "minbert.runtime": "", "minbert.tasks": "", "minbert.data.batches": "", "minbert.run": ""}
    modules = {}
    for name, source in sources.items():
        modules[name] = tmp_path / f"{name}.py"
        modules[name].write_text(source, encoding="utf-8")
    assert seam_crossings(modules) == [
        "bert.py, a building block, imports ['minbert.runtime']",
        "evaluation.py imports ['minbert.tasks'] and is imported by ['minbert.reports.plots']",
        "simcse.py imports ['minbert.runtime'] and is imported by ['minbert.run.run_setup']",
        "helpers.py imports ['minbert.runtime'] and is imported by ['smart']"]


def test_the_package_and_the_scripts_never_import_the_course_datasets_module():
    """Outside the repository's folder `import datasets` finds Hugging Face's library first: the package and the
    scripts import minbert.data.batches, and the course's datasets.py only names it."""
    for path in [*PACKAGE.rglob("*.py"), *ROOT.glob("scripts/*.py")]:
        assert "datasets" not in imported_modules(path), f"{path.relative_to(ROOT)} imports datasets"


def test_no_module_outside_tasks_tests_a_task_name():
    """Per-task behaviour is the task's (minbert/tasks/): the other modules ask it, so that a new task is a new
    file."""
    found = {}
    for path in [*ROOT.glob("*.py"), *ROOT.glob("scripts/*.py"), *PACKAGE.rglob("*.py")]:
        tests = [] if path.is_relative_to(PACKAGE / "tasks") else task_name_tests(path)
        if tests:
            found[str(path.relative_to(ROOT))] = tests
    assert not found, f"ask the task (minbert/tasks/base.py) instead of testing its name: {found}"


def test_the_test_only_oracles_stay_out_of_training_and_prediction():
    for path in [*ROOT.glob("*.py"), *ROOT.glob("scripts/*.py"), *PACKAGE.rglob("*.py")]:
        if path not in ORACLE_USERS:
            imported = {name.split(".")[0] for name in imported_modules(path)}
            assert not imported & ORACLES, f"{path.relative_to(ROOT)} imports a test-only oracle"


def task_name_tests(path: Path) -> list[str]:
    """Where a module tests a task's name: a comparison with a task's name or alias ('task == "sst"', '"qa" in
    tasks') or a dict literal keyed by two or more task names ({"sst": ..., "qqp": ...})."""
    tests = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(isinstance(part, ast.Constant) and part.value in TASK_NAMES
                                                 for part in (node.left, *node.comparators)):
            tests.append((node.lineno, "compares a task's name"))
        elif isinstance(node, ast.Dict) and sum(isinstance(key, ast.Constant) and key.value in TASK_NAMES
                                                for key in node.keys) >= 2:
            tests.append((node.lineno, "a dict keyed by task names"))
    return [f"line {line}: {what}" for line, what in sorted(tests)]


def test_the_boundary_checks_can_fail(tmp_path):
    cyclic = tmp_path / "module.py"
    cyclic.write_text("import minbert.training.trainer\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    import peft\ndef f():\n    from transformers import BertModel\n"
                      "from minbert.tasks import squad\n", encoding="utf-8")
    assert imported_modules(cyclic) == {"minbert.training.trainer", "typing", "transformers", "minbert.tasks",
                                        "minbert.tasks.squad"}
    assert [layer(name) for name in ("minbert.runtime", "minbert.tasks", "minbert.tasks.qa", "bert")] == [
        "core", "tasks", "tasks", None]
    named = tmp_path / "named.py"
    named.write_text('if task == "sst":\n    pass\nuse = "quora" in tasks\nheads = {"sst": 5, "qqp": 1}\n',
                     encoding="utf-8")
    assert task_name_tests(named) == ["line 1: compares a task's name", "line 3: compares a task's name",
                                      "line 4: a dict keyed by task names"]
    asking = tmp_path / "asking.py"
    asking.write_text('if encoder == "cross":\n    pass\nhead = {"sst": 5}\nname = "sst"\n', encoding="utf-8")
    assert task_name_tests(asking) == []
