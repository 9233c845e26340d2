"""Problems with input files, reported as one line that names the file; output files written whole.

DataError is raised for a file that cannot be used (missing, malformed, inconsistent): the command lines
print it as `error: <file>[:<line>]: <problem>` and exit with code 2. DataWarning reports rows dropped on
purpose (counted, with their lines), never silently.

Every whole-file write goes through atomic_write (or its text, bytes and CSV forms): the content is written in a
partial folder beside the file (.NAME.XXXXXXXX.minbert-partial, a name this project owns, which holds the writing
library's own temporaries too) and moved into place. A set of files saved together (checkpoint.py's weights and
JSON) writes each with write_aside, atomic_write's first half, and moves them in the order its reader relies on.
What a killed write leaves is removed by the next command that takes the folder's lock (locked_folder).

Which files a tool may write (docs/runs.md): none that it reads, and none inside a run's folder other than the runs it
writes for; forbidden_output says why a path is one of those, for a command line to refuse before anything loads.
"""
from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


LOCK = ".lock"  # locked_folder's file in a folder a command writes in
PARTIAL = ".minbert-partial"  # how the folders of writes under way end (partial_folder)
# The files that make a folder a run's (run_record.py's record, checkpoint.py's kept model): what lies below belongs
# to that run.
RUN_MARKERS = ("args.json", "best.json")


class DataError(ValueError):
    """A data file is missing or malformed; str() is one line naming the file (and line)."""

    def __init__(self, path: str | Path, problem: str, line: int | None = None):
        self.path = str(path)
        self.problem = problem
        self.line = line
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {problem}")


class OutputError(OSError):
    """An output file could not be written (a full disk, a read-only folder, a folder in its place); str() is one
    line naming the file. The command lines print it as `error: ...` and exit with code 2."""


@contextmanager
def refused_at_import(*errors: type[Exception]) -> Iterator[None]:
    """For a check a module runs when it is imported (the task and penalty registries): found while a command line
    imports the package, before its own handler can catch anything, `errors` end the program with the one line and
    exit code 2 that handler gives bad input, rather than a traceback."""
    try:
        yield
    except errors as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def describe_os_error(err: OSError) -> str:
    """One line for an OSError that reached a command line: the file, when the error knows it, and the problem."""
    if isinstance(err, OutputError) or err.filename is None:
        return str(err)
    return f"{err.filename}: {err.strerror or err}"


class DataWarning(UserWarning):
    """Rows were dropped while loading; the message gives the count, the file and the lines."""


def show_data_warnings_on_one_line() -> None:
    """For the command lines: a DataWarning prints as 'warning: <message>', without source lines."""
    default = warnings.formatwarning

    def format_warning(message, category, *args, **kwargs):
        if issubclass(category, DataWarning):
            return f"warning: {message}\n"
        return default(message, category, *args, **kwargs)
    warnings.formatwarning = format_warning


def read_input_bytes(path: str | os.PathLike) -> bytes:
    """The whole content of an input file, refused (DataError) unless it is a regular file: reading a FIFO or a
    device would wait for a writer forever, and a folder cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "file not found" if not path.exists()
                        else "not a regular file (a folder, FIFO or device cannot be read as one)")
    try:
        return path.read_bytes()
    except OSError as err:
        raise DataError(path, f"cannot be read ({err.strerror or err})") from None


def text_lines(text: str) -> list[str]:
    """The lines of a text read from the user, split at "\\n" alone, each without one trailing "\\r" (a Windows
    file): str.splitlines() also splits at U+2028, U+0085 and form feeds, which a sentence or a JSON string may hold,
    making one example two. A final line break ends the last line; it starts no empty one."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_input_text(path: str | os.PathLike) -> str:
    """An input file's text (read_input_bytes), UTF-8 without its byte-order mark; DataError naming the line of the
    first byte that is not UTF-8."""
    raw = read_input_bytes(path)
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise DataError(path, f"text is not valid UTF-8 (byte 0x{raw[err.start]:02x})",
                        raw.count(b"\n", 0, err.start) + 1) from None


@contextmanager
def locked_folder(directory: str | os.PathLike) -> Iterator[None]:
    """Hold DIRECTORY/.lock while a command writes there: a second process writing in the same folder at once is
    refused (DataError naming the lock) instead of interleaving its files with the first's. The lock is the
    kernel's (flock), so a killed process leaves none behind; what its writes left half done there, the next holder
    removes (remove_partial_writes)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / LOCK
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(lock, "another process is writing in this folder now; wait for it to end or write "
                                  "elsewhere") from None
        try:
            remove_partial_writes(directory)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_files(paths) -> list[Path]:
    """Remove those of `paths` that exist (files only); returns them."""
    removed = [Path(path) for path in paths if Path(path).is_file()]
    for path in removed:
        path.unlink()
    return removed


def unwritable_folder(directory: str | os.PathLike) -> str | None:
    """Why `directory` cannot be created or written ('<dir>: cannot write there, <path> is a file, not a
    folder'), or None when it can: the command lines check their output folders before doing any work."""
    directory = Path(directory)
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{directory}: cannot write there, {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{directory}: cannot write there, {existing} is not writable"
    return None


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Have `write(temporary)` write the whole file under a temporary name, then move it over `path`: a crash or an
    error mid-write never leaves a truncated file that looks complete, and leaves an old file as it was."""
    path = Path(path)
    with partial_folder(path) as folder:
        written = _write_whole(path, write, folder)
        try:
            os.replace(written, path)
        except OSError as err:  # e.g. a folder in the file's place
            raise OutputError(f"{path}: cannot write it ({err.strerror or err})") from None


def write_aside(path: str | os.PathLike, write: Callable[[Path], object], temporary: Path) -> Path:
    """Have `write(...)` write the whole new content of `path` and move it to `temporary`, for the caller to move
    into place (os.replace); returns `temporary`. A fixed name lets a reader find one that a kill left behind
    (checkpoint.py finishes a save that way); until the write is whole it lies in a partial folder."""
    path = Path(path)
    with partial_folder(path) as folder:
        written = _write_whole(path, write, folder)
        try:
            os.replace(written, temporary)
        except OSError as err:
            raise OutputError(f"{path}: cannot write it ({err.strerror or err})") from None
    return Path(temporary)


@contextmanager
def partial_folder(path: Path) -> Iterator[Path]:
    """A fresh folder .NAME.XXXXXXXX.minbert-partial beside `path`, removed on leaving with whatever it holds.
    Everything written there is this project's temporary, the temporaries of the libraries that write the file too
    (safetensors' save_file writes a .tmpXXXXXX of its own beside its target): a kill leaves a name this project owns,
    which remove_partial_writes removes once the folder's lock is held."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL))
    except OSError as err:  # a read-only folder, a file in a folder's place
        raise OutputError(f"{path}: cannot write it ({err.strerror or err})") from None
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _write_whole(path: Path, write: Callable[[Path], object], folder: Path) -> Path:
    """`write` of `path`'s content into `folder`, with the mode open() would give it; the file written."""
    written = folder / path.name
    try:
        write(written)
        os.chmod(written, new_file_mode())  # safetensors gives 0600: a file other users cannot read
    except OSError as err:  # a full disk, a quota
        raise OutputError(f"{path}: cannot write it ({err.strerror or err})") from None
    return written


def remove_partial_writes(directory: str | os.PathLike) -> list[Path]:
    """Remove the partial folders (partial_folder) that killed writes left in `directory` and the folders below it,
    but not below a folder with a .lock of its own: another command's, whose writes may be under way. For the
    holder of `directory`'s lock (locked_folder), whose folder no other write is then under way in."""
    removed = []
    for parent, folders, _ in os.walk(directory):
        for name in list(folders):
            if name.endswith(PARTIAL):
                shutil.rmtree(Path(parent) / name, ignore_errors=True)
                removed.append(Path(parent) / name)
            if name.endswith(PARTIAL) or (Path(parent) / name / LOCK).exists():
                folders.remove(name)
    return removed


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """`text` as UTF-8, line ends as they are, written as atomic_write does."""
    atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8", newline=""))


def atomic_write_bytes(path: str | os.PathLike, content: bytes) -> None:
    """`content` unchanged, written as atomic_write does."""
    atomic_write(path, lambda temporary: temporary.write_bytes(content))


def atomic_write_csv(path: str | os.PathLike, rows) -> None:
    """Rows (the header first) as a comma-separated file with "\n" line ends, written as atomic_write does."""
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    atomic_write_text(path, text.getvalue())


def new_file_mode() -> int:
    """The mode open() gives a new file under the current umask (mkstemp and safetensors use 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in blocks (a checkpoint's weights, a train scores file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_folder_of(path: str | os.PathLike) -> Path | None:
    """The run folder `path` lies in (or is): the nearest folder at or above it holding a RUN_MARKERS file; None."""
    for folder in (Path(path).resolve(), *Path(path).resolve().parents):
        if any((folder / marker).is_file() for marker in RUN_MARKERS):
            return folder
    return None


def repeated_run(folders) -> str | None:
    """'B is the same run as A; give each run once' for the first folder given twice however spelled (a link, ..),
    or None: a run counted twice would weigh double in any mean over runs."""
    seen: dict[Path, Path] = {}
    for folder in map(Path, folders):
        earlier = seen.setdefault(folder.resolve(), folder)
        if earlier is not folder:
            return f"{folder} is the same run as {earlier}; give each run once"
    return None


def repeated_arm(arms) -> str | None:
    """'arms: B names the same runs as A; ...' for the first arm (name, folders) whose runs, however spelled and in
    any order, are an earlier arm's, or None: an arm compared with itself differs by exactly 0, which says nothing."""
    seen: dict[frozenset, str] = {}
    for name, folders in arms:
        runs = frozenset(Path(folder).resolve() for folder in folders)
        if runs in seen:
            return f"arms: {name} names the same runs as {seen[runs]}; an arm compared with itself differs by exactly 0"
        seen[runs] = name
    return None


def forbidden_output(flag: str, path: str | os.PathLike, reads=(), own_runs=()) -> str | None:
    """Why the tool must not write `path` (a file or folder its `flag` names), in one line naming both, or None: it
    is, or lies in, a file or folder the tool `reads` (the user's input), or it lies in a run's folder other than the
    `own_runs` (folders, or checkpoint prefixes in them) the tool writes for (that run's files)."""
    target = Path(path).resolve()
    for source in (Path(read).resolve() for read in reads):
        if target == source or target.is_relative_to(source):
            return f"{flag} {path}: would replace {'it' if target == source else source}, which this command " \
                   "reads; write elsewhere"
    owner = run_folder_of(target)
    if owner is not None and owner not in {run_folder_of(run) for run in own_runs}:
        return f"{flag} {path}: inside the run folder {owner}, whose files belong to that run; write elsewhere"
    return None
