"""files.py's whole-file writes: a failure mid-write leaves the old file as it was, for every kind of writer."""
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import minbert.model.checkpoint as checkpoint
from minbert.files import (PARTIAL, atomic_write, atomic_write_bytes, atomic_write_csv, atomic_write_text, locked_folder,
                           file_sha256, unwritable_folder, write_aside)
from minbert.model.checkpoint import atomic_save, read_checkpoint
from prepare_submit import write_zip

FULL_DISK = "No space left on device"


def half_then_full_disk(real):
    """Path.write_text / write_bytes that write half of their content, then fail as a full disk would."""
    def write(self, data, *args, **kwargs):
        real(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(28, FULL_DISK)
    return write


def member_then_full_disk(real):
    """ZipFile.write that stores its member, then fails before the archive is complete."""
    def write(self, *args, **kwargs):
        real(self, *args, **kwargs)
        raise OSError(28, FULL_DISK)
    return write


def write_zip_of(path: Path, text: str) -> None:
    """prepare_submit's zip of one file holding `text`, written as prepare_submit writes it."""
    member = path.parent.parent / "member.txt"
    member.write_text(text)
    atomic_write(path, lambda target: write_zip(target, [(member, "member.txt")]))


WRITERS = {  # kind: (write(path, text), where a full disk stops it mid-write)
    "text": (atomic_write_text, (Path, "write_text", half_then_full_disk)),
    "csv": (lambda path, text: atomic_write_csv(path, [("id", "text"), ("a", text)]),
            (Path, "write_text", half_then_full_disk)),
    "bytes": (lambda path, text: atomic_write_bytes(path, text.encode()), (Path, "write_bytes", half_then_full_disk)),
    "zip": (write_zip_of, (zipfile.ZipFile, "write", member_then_full_disk)),
}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(kind, tmp_path, monkeypatch):
    write, (owner, method, failing) = WRITERS[kind]
    path = tmp_path / "out" / "file"
    write(path, "old")
    old = path.read_bytes()
    monkeypatch.setattr(owner, method, failing(getattr(owner, method)))
    with pytest.raises(OSError, match=FULL_DISK):
        write(path, "new content")
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert os.listdir(path.parent) == ["file"]


def test_a_failed_move_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "file.txt"
    atomic_write_text(path, "old\n")

    def full_disk(source, target):
        raise OSError(28, FULL_DISK)
    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match=FULL_DISK):
        atomic_write_text(path, "new\n")
    monkeypatch.undo()
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["file.txt"]


def test_checkpoint_weights_failing_mid_write_leave_the_previous_checkpoint(tmp_path, monkeypatch):
    atomic_save(tmp_path / "best", {"w": torch.zeros(2)}, {"n": 1})

    def half_written(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\x00" * 8)
        raise OSError(28, FULL_DISK)
    monkeypatch.setattr(checkpoint, "save_file", half_written)
    with pytest.raises(OSError, match=FULL_DISK):
        atomic_save(tmp_path / "best", {"w": torch.ones(2)}, {"n": 2})
    monkeypatch.undo()
    tensors, metadata = read_checkpoint(tmp_path / "best")
    assert metadata["n"] == 1 and torch.equal(tensors["w"], torch.zeros(2))
    assert sorted(os.listdir(tmp_path)) == ["best.json", "best.safetensors"]


def test_checkpoint_json_failing_mid_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    atomic_save(tmp_path / "best", {"w": torch.zeros(2)}, {"n": 1})
    monkeypatch.setattr(Path, "write_text", half_then_full_disk(Path.write_text))
    with pytest.raises(OSError, match=FULL_DISK):
        atomic_save(tmp_path / "best", {"w": torch.ones(2)}, {"n": 2})
    monkeypatch.undo()
    tensors, metadata = read_checkpoint(tmp_path / "best")
    assert metadata["n"] == 1 and torch.equal(tensors["w"], torch.zeros(2))
    assert not (tmp_path / "best.json.tmp").exists()


def test_whole_files_get_the_mode_open_would_give(tmp_path):
    previous = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "data.csv", b"id\tsentence\n")  # mkstemp alone would give 0600
        atomic_write(tmp_path / "s.zip", lambda path: zipfile.ZipFile(path, "w").close())
    finally:
        os.umask(previous)
    assert [(tmp_path / name).stat().st_mode & 0o777 for name in ("data.csv", "s.zip")] == [0o644, 0o644]


def test_write_aside_writes_the_given_temporary_and_leaves_the_move_to_the_caller(tmp_path):
    path = tmp_path / "sub" / "weights.safetensors"
    temporary = write_aside(path, lambda target: target.write_bytes(b"new"), path.with_name("weights.tmp"))
    assert temporary == path.with_name("weights.tmp") and temporary.read_bytes() == b"new" and not path.exists()


def test_unwritable_folder_names_the_file_in_the_way(tmp_path):
    (tmp_path / "a_file").write_text("")
    assert unwritable_folder(tmp_path / "new" / "deeper") is None
    assert unwritable_folder(tmp_path / "a_file" / "out") == (
        f"{tmp_path / 'a_file' / 'out'}: cannot write there, {tmp_path / 'a_file'} is a file, not a folder")


KILLED_MID_WRITE = """
import sys, time
from pathlib import Path
from minbert.files import atomic_write

def write(temporary):  # as safetensors' save_file does: its own .tmpXXXXXX beside its target, then a rename
    (temporary.parent / ".tmpAbC123").write_bytes(b"half of the weights")
    print("writing", flush=True)
    time.sleep(60)
atomic_write(Path(sys.argv[1]) / "last.safetensors", write)
"""


def killed_mid_write(folder: Path) -> Path:
    """A process killed while it writes FOLDER/last.safetensors; returns what it left there."""
    import signal
    import subprocess
    import sys
    folder.mkdir(parents=True, exist_ok=True)
    writer = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(folder)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "writing\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    (left,) = folder.iterdir()
    return left


def test_a_killed_write_leaves_a_partial_folder_that_the_next_holder_of_the_lock_removes(tmp_path):
    left = killed_mid_write(tmp_path / "run")
    assert left.name.startswith(".last.safetensors.") and left.name.endswith(PARTIAL)  # a name the project owns
    assert (left / ".tmpAbC123").is_file()  # the library's own temporary inside it
    with locked_folder(tmp_path / "run"):
        assert sorted(path.name for path in (tmp_path / "run").iterdir()) == [".lock"]


def test_safetensors_own_temporary_lands_in_the_partial_folder(tmp_path):
    """save_file writes a .tmpXXXXXX of its own beside its target before renaming it: beside the partial file."""
    seen = []

    def save(temporary):
        checkpoint.save_tensors({"w": torch.zeros(1 << 20)}, temporary)
        seen.extend(os.listdir(tmp_path))
    atomic_write(tmp_path / "model.safetensors", save)
    assert len(seen) == 1 and seen[0].endswith(PARTIAL)
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_the_lock_holder_leaves_the_partial_writes_of_a_folder_locked_by_another_command(tmp_path):
    (tmp_path / "run" / "scores" / ".x.csv.a1b2c3d4.minbert-partial").mkdir(parents=True)
    inner = tmp_path / "run" / "ensemble"  # another command's folder: its writes may be under way
    (inner / ".x.csv.a1b2c3d4.minbert-partial").mkdir(parents=True)
    (inner / ".lock").touch()
    (tmp_path / "run" / "notes.tmp").write_text("the user's")
    with locked_folder(tmp_path / "run"):
        assert not (tmp_path / "run" / "scores" / ".x.csv.a1b2c3d4.minbert-partial").exists()
        assert (inner / ".x.csv.a1b2c3d4.minbert-partial").is_dir() and (tmp_path / "run" / "notes.tmp").is_file()


def test_settling_a_folder_finishes_a_save_killed_between_its_moves_and_drops_one_killed_before(tmp_path):
    atomic_save(tmp_path / "last", {"w": torch.zeros(2)}, {"n": 1})
    atomic_save(tmp_path / "best", {"w": torch.zeros(2)}, {"n": 1})
    save_file({"w": torch.ones(2)}, str(tmp_path / "best.safetensors.tmp"))  # killed before the JSON moved
    (tmp_path / "best.json.tmp").write_text("{}")
    pending = tmp_path / "last.safetensors.tmp"  # killed between the moves: the JSON names these weights
    save_file({"w": torch.ones(2)}, str(pending))
    info = json.loads((tmp_path / "last.json").read_text())
    (tmp_path / "last.json").write_text(json.dumps({**info, "n": 2, "sha256": file_sha256(pending)}))
    removed = checkpoint.settle_interrupted_saves(tmp_path)
    assert sorted(path.name for path in removed) == ["best.json.tmp", "best.safetensors.tmp"]
    assert sorted(os.listdir(tmp_path)) == ["best.json", "best.safetensors", "last.json", "last.safetensors"]
    assert torch.equal(read_checkpoint(tmp_path / "last")[0]["w"], torch.ones(2))
    assert torch.equal(read_checkpoint(tmp_path / "best")[0]["w"], torch.zeros(2))


def test_an_output_may_not_be_an_input_nor_lie_in_another_runs_folder(tmp_path, monkeypatch):
    from minbert.files import forbidden_output
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.csv").write_text("x")
    for run in ("mine", "theirs"):
        (tmp_path / run / "predictions").mkdir(parents=True)
        (tmp_path / run / "args.json").write_text("{}")
    assert forbidden_output("--output", "sub/../in.csv", reads=["in.csv"]) == (
        "--output sub/../in.csv: would replace it, which this command reads; write elsewhere")
    assert forbidden_output("--output", "inputs/a.md", reads=["inputs"]).startswith(
        f"--output inputs/a.md: would replace {tmp_path / 'inputs'}, which")
    assert forbidden_output("--out", "theirs/predictions/x.csv", own_runs=["mine"]) == (
        f"--out theirs/predictions/x.csv: inside the run folder {tmp_path / 'theirs'}, whose files belong to that run; "
        "write elsewhere")
    assert forbidden_output("--out", "mine/predictions/x.csv", own_runs=["mine/best"]) is None  # a checkpoint prefix
    assert forbidden_output("--out", "elsewhere/x.csv", reads=["in.csv"], own_runs=["mine"]) is None


def test_a_file_in_a_run_whose_record_is_damaged_is_not_written(tmp_path):
    """Where a run's CSVs went is in its best.json: unreadable, no file of its folder can be told apart from the
    run's own, so none is written; a readable run's own files are refused by name, others allowed."""
    from minbert.run.run_files import replaces_run_file
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.json").write_text(json.dumps({"metrics": {}, "args": {}}))
    assert replaces_run_file("--output", run / "best.json").endswith(f"would replace a file of the run {run}; "
                                                                      "write elsewhere or under another name")
    assert replaces_run_file("--output", run / "mine.png") is None
    (run / "best.json").write_text('{"metrics": {')  # cut short
    problem = replaces_run_file("--output", run / "mine.png")
    assert problem.startswith(f"--output {run / 'mine.png'}: inside the run folder {run}, whose record cannot be read")
