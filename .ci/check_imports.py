"""Every module the repository imports is declared: in pyproject.toml's dependencies or optional dependencies, or in a
requirements file. Run inside the environment that README's commands made (CI's fresh venv), it prints one line for
each module that comes from no declared package, and exits 1; 0 when every import is declared.

    python .ci/check_imports.py [ROOT]

It reads every tracked .py file and the notebooks' code cells: `import x`, `from x import y`, and the strings given
to pytest.importorskip, importlib.import_module, importlib.util.find_spec and minbert.runtime.import_problem (the
project's optional features import their package that way, when the feature is chosen). A module counts as declared
when a declared distribution provides it in this environment (importlib.metadata.packages_distributions), so a
package that arrives only as another's dependency (sqlalchemy through optuna) is not declared.
"""
from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

# Modules that no requirements file can install: the platform provides them where the code that imports them runs.
PROVIDED_BY_PLATFORM = {"google": "google.colab, Colab's own module (notebooks/colab.ipynb's Colab-only cells)"}
DYNAMIC_IMPORTERS = {"importorskip", "import_module", "find_spec", "import_problem"}
REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        match = REQUIREMENT_NAME.match(line) if line and not line.startswith("-") else None
        if match:
            names.add(normalized(match.group(1)))
    return names


def declared_distributions(root: Path) -> set[str]:
    """The distributions pyproject.toml and every requirements*.txt name (an `-e .` line installs pyproject's)."""
    names = set()
    for path in sorted(root.glob("requirements*.txt")):
        names |= requirement_names(path.read_text(encoding="utf-8").splitlines())
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        import tomllib

        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        names |= requirement_names(project.get("dependencies", []))
        for group in project.get("optional-dependencies", {}).values():
            names |= requirement_names(group)
    return names


def imported_modules(source: str) -> list[tuple[str, int]]:
    """(top-level module, line) for every absolute import and every module named to a dynamic importer."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in DYNAMIC_IMPORTERS and isinstance(node.args[0].value, str):
                found.append((node.args[0].value, node.lineno))
    return [(name.split(".")[0], line) for name, line in found]


def notebook_source(path: Path) -> str:
    """A notebook's code cells as one Python source; IPython's % and ! lines become blank lines."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    lines = [line.rstrip("\n") for cell in cells if cell["cell_type"] == "code" for line in cell["source"]]
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


def tracked_files(root: Path) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py", "*.ipynb"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.split()
    return [root / name for name in listed]


def undeclared_imports(root: Path) -> list[str]:
    """One line for each module imported under `root` that no declared distribution provides."""
    files = tracked_files(root)
    # The repository's own modules: every .py file (the tests put scripts/ on the path) and every top-level folder
    # (a package, or a folder imported as a namespace package from the repository's root).
    local = {path.stem for path in files if path.suffix == ".py"} | {
        path.relative_to(root).parts[0] for path in files if len(path.relative_to(root).parts) > 1}
    declared = declared_distributions(root)
    providers = importlib.metadata.packages_distributions()
    first_use: dict[str, str] = {}
    for path in files:
        source = notebook_source(path) if path.suffix == ".ipynb" else path.read_text(encoding="utf-8")
        for module, line in imported_modules(source):
            first_use.setdefault(module, f"{path.relative_to(root)}:{line}")
    problems = []
    for module, where in sorted(first_use.items()):
        if module in sys.stdlib_module_names or module in local or module in PROVIDED_BY_PLATFORM:
            continue
        distributions = {normalized(name) for name in providers.get(module, [])} or {normalized(module)}
        if not distributions & declared:
            source = ", ".join(sorted(providers.get(module, []))) or "a package not installed here"
            problems.append(f"undeclared import: {module} ({where}) comes from {source}, which no requirements "
                            "file or pyproject.toml names")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    problems = undeclared_imports(Path(args[0] if args else Path(__file__).resolve().parent.parent))
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
