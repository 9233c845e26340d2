"""Size limits that keep each piece readable in one sitting (issue 38): no class over 250 lines and no function over
50, in the project's own code (the library, the course's files and the scripts; tests are exempt: a test reads top
to bottom). A class that grows past the limit is doing two jobs; split it rather than raise the limit.

Classes have a limit on their methods as well (issue 58), in the same code: a class of more methods does several
jobs (the task interface's parts: a task's data, its model side, its outputs; MultitaskBERT and its readout)."""
import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 50
MAX_CLASS_METHODS = 20
# Named exemptions, each a function that is meant to be read in one piece. StepLoop.run_steps is the training step
# top to bottom (issue 58): the batch, the forward, the task's loss and its penalties, the backward, the update, the
# log line and the checkpoint, as nanoGPT's train.py shows them; cut to 50 lines it fell into fragments again.
EXEMPT_FUNCTIONS = {("minbert/training/loop.py", "run_steps"): 70}


def project_sources() -> list[Path]:
    sources = [*ROOT.glob("*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("minbert/**/*.py")]
    return sorted(path for path in sources if path.is_file())


def shown_name(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    name = shown_name(path, root)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                 else EXEMPT_FUNCTIONS.get((name, node.name), MAX_FUNCTION_LINES)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if limit is not None and node.end_lineno - node.lineno + 1 > limit:
            found.append(f"{name}:{node.lineno} {node.name} "
                         f"({node.end_lineno - node.lineno + 1} lines, limit {limit})")
    return found


def test_no_class_or_function_over_the_limits():
    assert not [entry for path in project_sources() for entry in oversized(path)]


def test_the_check_sees_an_oversized_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    module = tmp_path / "long.py"
    module.write_text(f"def long():\n{body}\n")
    assert oversized(module) == [f"long.py:1 long ({MAX_FUNCTION_LINES + 1} lines, limit {MAX_FUNCTION_LINES})"]


def crowded(path: Path, root: Path = ROOT) -> list[str]:
    """The classes of `path` defining more than MAX_CLASS_METHODS methods in their own body."""
    name = shown_name(path, root)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body)
            if methods > MAX_CLASS_METHODS:
                found.append(f"{name}:{node.lineno} {node.name} ({methods} methods, "
                             f"limit {MAX_CLASS_METHODS})")
    return found


def test_no_class_over_the_method_limit():
    assert not [entry for path in project_sources() for entry in crowded(path)]


def test_the_check_sees_a_crowded_class(tmp_path):
    body = "\n".join(f"    def m{i}(self):\n        pass" for i in range(MAX_CLASS_METHODS + 1))
    module = tmp_path / "crowded.py"
    module.write_text(f"class Crowded:\n{body}\n")
    assert crowded(module) == [f"crowded.py:1 Crowded ({MAX_CLASS_METHODS + 1} methods, "
                               f"limit {MAX_CLASS_METHODS})"]


def test_an_exemption_holds_for_its_own_function_only(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    module = tmp_path / "minbert" / "training" / "loop.py"
    module.parent.mkdir(parents=True)
    module.write_text(f"def run_steps():\n{body}\n\n\ndef other():\n{body}\n")
    assert [entry.split(" ")[1] for entry in oversized(module, tmp_path)] == ["other"]
