"""The seams between the project's modules, read from their import statements: no import cycle, library
modules never import a command line, the trainer never reads the command line's settings, and the test-only
oracles (transformers, sentence-transformers, peft) stay out of training and prediction."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = {path.stem: path for path in ROOT.glob("*.py")}
# The command lines at the top level; scripts/*.py are command lines too.
COMMAND_LINES = {"multitask_classifier", "classifier", "ensemble", "prepare_submit", "sanity_check", "optimizer_test"}
ORACLES = {"transformers", "sentence_transformers", "peft"}
ORACLE_USERS = {ROOT / "sanity_check.py", ROOT / "scripts" / "benchmark.py"}


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module `path` imports, in functions too, but not under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_checking = {id(node) for branch in ast.walk(tree) if isinstance(branch, ast.If)
                     and getattr(branch.test, "id", None) == "TYPE_CHECKING" for node in ast.walk(branch)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def project_imports(path: Path) -> set[str]:
    return imported_modules(path) & MODULES.keys()


def test_the_top_level_modules_import_each_other_without_a_cycle():
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
            assert not project_imports(path) & COMMAND_LINES, f"{path.name} imports a command line"


def test_scripts_never_import_another_command_line():
    """A script that trains as multitask_classifier.py does shares its library code (run_setup, training_args)."""
    for path in ROOT.glob("scripts/*.py"):
        assert not project_imports(path) & COMMAND_LINES, f"{path.relative_to(ROOT)} imports a command line"


def test_the_trainer_reads_no_command_line_settings():
    assert not project_imports(MODULES["trainer"]) & (COMMAND_LINES | {"training_args"})
    assert not project_imports(MODULES["training_state"]) & {"trainer", "training_args"}


def test_the_test_only_oracles_stay_out_of_training_and_prediction():
    for path in [*ROOT.glob("*.py"), *ROOT.glob("scripts/*.py")]:
        if path not in ORACLE_USERS:
            assert not imported_modules(path) & ORACLES, f"{path.relative_to(ROOT)} imports a test-only oracle"


def test_the_boundary_checks_can_fail(tmp_path):
    cyclic = tmp_path / "module.py"
    cyclic.write_text("import trainer\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import peft\n"
                      "def f():\n    from transformers import BertModel\n", encoding="utf-8")
    assert imported_modules(cyclic) == {"trainer", "typing", "transformers"}
