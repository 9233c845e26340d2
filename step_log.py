"""What a run reports while it trains: a line in OUTPUT_DIR/steps.jsonl every --logging_steps updates (and at each
stage's end), and with --report_to tensorboard the same scalars, and each stage's dev metrics, as TensorBoard events
in OUTPUT_DIR/tensorboard/.

Nothing here waits for the device between two lines: the values a line reports are summed on the device
(DeviceSums) and read back together, in one transfer (read_back), when the line is written.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

REPORT_TO = ("none", "tensorboard")
STEPS_FILE = "steps.jsonl"
TENSORBOARD_DIR = "tensorboard"


def read_back(values: list[torch.Tensor]) -> list[float]:
    """0-dim device tensors as host floats, all in one device-to-host transfer (one host sync)."""
    return torch.stack([value.detach().to(torch.float64) for value in values]).tolist()


class DeviceSums:
    """Running sums of named 0-dim device tensors, and how many were added to each (counted on the host): adding
    reads nothing back."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}

    def add(self, name: str, value: torch.Tensor) -> None:
        if name in self.sums:
            self.sums[name] += value.detach()
        else:  # float64, so that thousands of small terms add up without rounding
            self.sums[name] = value.detach().to(torch.float64, copy=True)
        self.counts[name] = self.counts.get(name, 0) + 1

    def clear(self) -> None:
        self.sums.clear()
        self.counts.clear()

    def load_state(self, sums: dict[str, torch.Tensor], counts: dict[str, int]) -> None:
        """Sums and counts as a checkpoint kept them (`counts` in the order the names were first added)."""
        self.sums = {name: sums[name] for name in counts}
        self.counts = dict(counts)


class RunLog:
    """Writes steps.jsonl and, with report_to "tensorboard", the TensorBoard events; a process that is not the main
    one (`active` False) writes nothing. TensorBoard is imported only when it is chosen, at the first write."""

    def __init__(self, output_dir: Path, report_to: str = "none", active: bool = True):
        if report_to not in REPORT_TO:
            raise ValueError(f"report_to must be one of {', '.join(REPORT_TO)}, got {report_to!r}")
        self.output_dir, self.report_to, self.active = Path(output_dir), report_to, active
        self.writer = None
        self.resumed_at: int | None = None  # the updates of the checkpoint a resumed run continues from

    @property
    def steps_path(self) -> Path:
        return self.output_dir / STEPS_FILE

    def step(self, line: dict) -> None:
        """One line of steps.jsonl, appended; in TensorBoard its numbers as train/NAME at step line["update"]
        (a dict of numbers, such as the tasks' losses, as train/NAME_KEY)."""
        if not self.active:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.steps_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
        scalars = {}
        for name, value in line.items():
            if isinstance(value, dict):
                scalars.update({f"train/{name}_{key}": v for key, v in value.items()})
            elif name != "update":
                scalars[f"train/{name}"] = value
        self.scalars(scalars, line["update"])

    def scalars(self, values: dict[str, object], update: int) -> None:
        """TensorBoard scalars by tag at step `update` (the numbers among `values`), when TensorBoard is chosen."""
        if not self.active or self.report_to != "tensorboard":
            return
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter
            # A resumed run's events hide those an earlier process wrote after its checkpoint, as steps.jsonl drops
            # them (resume): TensorBoard purges every step from purge_step on that came before this writer's start.
            purge = None if self.resumed_at is None else self.resumed_at + 1
            self.writer = SummaryWriter(str(self.output_dir / TENSORBOARD_DIR), purge_step=purge)
            self.resumed_at = None  # a writer opened later in this process must not hide this one's events
        for tag, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(tag, value, update)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def resume(self, updates: int) -> None:
        """Continue a run from a checkpoint of `updates` updates: the lines of steps.jsonl after it are dropped (the
        resumed run logs those updates again), with any line cut short by a kill, and so are, for TensorBoard, the
        later events of the earlier process."""
        self.resumed_at = updates
        if not self.active or not self.steps_path.is_file():
            return
        kept = []
        for text in self.steps_path.read_text(encoding="utf-8").splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(line, dict) and isinstance(line.get("update"), int) and line["update"] <= updates:
                kept.append(text + "\n")
        self.steps_path.write_text("".join(kept), encoding="utf-8")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
