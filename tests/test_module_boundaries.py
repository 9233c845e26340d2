"""The seams between the project's modules, read from their import statements and syntax: the package's layers
(minbert/__init__.py) import only the layers below them, no import cycle, library modules never import a command
line, no module outside minbert/tasks/ tests a task's name (it asks the task), and the test-only oracles
(transformers, sentence-transformers, peft) stay out of training and prediction."""
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
LAYERS = ("core", "tasks", "data", "model", "prediction", "reports", "training", "run")
ORACLES = {"transformers", "sentence_transformers", "peft"}
ORACLE_USERS = {ROOT / "sanity_check.py", ROOT / "scripts" / "benchmark.py"}
TASK_NAMES = {name for task in TASKS.values() for name in (task.name, *task.aliases)}


def imported_modules(path: Path) -> set[str]:
    """The dotted names of every module `path` imports, in functions too, but not under `if TYPE_CHECKING:`;
    `from a.b import c` gives a.b and, where c is a module of the project, a.b.c."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_checking = {id(node) for branch in ast.walk(tree) if isinstance(branch, ast.If)
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


def project_imports(path: Path) -> set[str]:
    return imported_modules(path) & MODULES.keys()


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
        above = {imported for imported in project_imports(path)
                 if layer(imported) and LAYERS.index(layer(imported)) > LAYERS.index(layer(name))}
        assert not above, f"{path.relative_to(ROOT)} ({layer(name)}) imports a layer above it: {sorted(above)}"


def test_the_modules_import_each_other_without_a_cycle():
    graph = {name: project_imports(path) - {name} for name, path in MODULES.items()}
    done, active = set(), []

    def visit(name: str) -> None:
        if name in active:
            cycle = active[active.index(name):] + [name]
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")
        if name in done:
            return
        active.append(name)
        for imported in sorted(graph[name]):
            visit(imported)
        active.pop()
        done.add(name)
    for module in sorted(graph):
        visit(module)


def test_library_modules_never_import_a_command_line():
    for name, path in MODULES.items():
        if name not in COMMAND_LINES:
            assert not project_imports(path) & COMMAND_LINES, f"{path.relative_to(ROOT)} imports a command line"


def test_scripts_never_import_another_command_line():
    """A script that trains as multitask_classifier.py does shares its library code (minbert.run)."""
    for path in ROOT.glob("scripts/*.py"):
        assert not imported_modules(path) & COMMAND_LINES, f"{path.relative_to(ROOT)} imports a command line"


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
