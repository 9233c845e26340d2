"""Several command lines of multitask_classifier.py / classifier.py run one after another in one interpreter, for
tests/test_distributed.py: every fresh launch costs its interpreters' start (importing torch: 5-10 s each on two
busy cores, three per torchrun launch), so the runs that used to take a launch each share two.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/runs_in_one_launch.py RUNS.json
    python tests/runs_in_one_launch.py RUNS.json

RUNS.json: a list of [name, script, argv], script "multitask_classifier" or "classifier", run in that order. Each
run's exit code and what this rank printed (stdout, stderr) go to NAME.rank<RANK>.json beside RUNS.json. The tests
call `launch`, which writes RUNS.json, runs the launch and reads the results back.

Under torchrun the ranks keep one process group for all the runs (each run joins it as from_environment finds it
already joined; it is left once, at the end): a group destroyed and made again in the same processes would
rendezvous on the keys the first left in torchrun's store. A run that raises kills its rank, and torchrun the
other, as a lone run would: a rank that carried on would wait forever in a collective the other never reaches.
"""
import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(folder: Path, processes: int, runs: list, timeout: int = 900) -> dict[str, dict]:
    """Runs ([name, script, argv]) one after another in one launch of `processes` processes (torchrun when more
    than one); by name: every rank's exit code, and the ranks' stdout and stderr joined. A failed launch names the
    results each rank had written before it: where in the launch it stopped."""
    runs_file = folder / f"runs-{processes}.json"
    runs_file.write_text(json.dumps(runs))
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes > 1 else []
    result = subprocess.run([sys.executable, *launcher, __file__, str(runs_file)], cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                            timeout=timeout)
    written = sorted(path.name for path in folder.glob("*.rank*.json"))
    assert result.returncode == 0, f"results written: {written}\n{result.stderr[-3000:]}"
    outcomes = {}
    for name, _, _ in runs:
        ranks = [json.loads((folder / f"{name}.rank{rank}.json").read_text()) for rank in range(processes)]
        outcomes[name] = {"returncodes": [r["returncode"] for r in ranks],
                          "stdout": "".join(r["stdout"] for r in ranks), "stderr": "".join(r["stderr"] for r in ranks)}
    return outcomes


def main(runs_file: str) -> int:
    sys.path.insert(0, str(ROOT))  # the scripts' modules (this file's own folder is tests/)
    import torch.distributed as dist

    from minbert.distributed import Distributed
    leave_group = Distributed.shutdown

    def end_of_run(self, failed: bool = False) -> None:  # how each run leaves the group; the ranks leave once, below
        if self.enabled and not failed:
            dist.barrier()  # as a run's leaving does: no rank starts the next run while another is in a collective
    Distributed.shutdown = end_of_run
    rank = os.environ.get("RANK", "0")
    folder = Path(runs_file).parent
    for name, script, argv in json.loads(Path(runs_file).read_text()):
        stdout, stderr = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    code = importlib.import_module(script).main(argv)
                except SystemExit as exit:  # argparse's refusals
                    code = exit.code
        except BaseException:
            print(f"{name} (rank {rank}) raised; what it had printed to stderr:\n{stderr.getvalue()}", file=sys.stderr)
            raise
        (folder / f"{name}.rank{rank}.json").write_text(json.dumps(
            {"returncode": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}))
    if dist.is_initialized():  # every run ended at a barrier: no rank is still in a collective
        leave_group(Distributed(int(rank), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    # Out without the interpreter's teardown, every result written: a rank of this launch once aborted in CI
    # ("terminate called without an active exception", SIGABRT; where, its output did not show), the message of
    # gloo's known teardown aborts (pytorch/pytorch#179291: its threads' tensors freed while the interpreter
    # finalises), and the teardown of several runs' objects is not what this launch is here to test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
