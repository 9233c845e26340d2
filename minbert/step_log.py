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

from minbert.files import atomic_write_text

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


class TrainingDiverged(RuntimeError):
    """A loss that is not finite: the run stops there rather than train every later stage on NaN."""


class StageLosses:
    """A stage's losses, kept on the device: adding one reads nothing back, so the device runs ahead of the host.
    The host reads them (read_recent, read_mean) only every logging_steps updates and at the stage's end, and
    then also learns whether some loss was not finite, and at which update the first one was."""

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), dtype=torch.float64, device=device)
        self.recent = torch.zeros((), dtype=torch.float64, device=device)
        self.first_nonfinite = torch.full((), -1, dtype=torch.int64, device=device)  # an update, or -1
        self.count = self.recent_count = 0

    def add(self, loss: torch.Tensor, update: int) -> None:
        """One micro-step's loss (a 0-dim tensor on the device), taken during optimizer update `update` (0-based)."""
        loss = loss.to(torch.float64)
        self.total += loss
        self.recent += loss
        self.count += 1
        self.recent_count += 1
        self.first_nonfinite.masked_fill_((self.first_nonfinite < 0) & ~torch.isfinite(loss), update)

    def read_recent(self, where: str, also: dict | None = None) -> tuple[float, dict[object, float]]:
        """The mean loss since the last read_recent, and the 0-dim device tensors of `also` as host floats (by the
        same keys): all read back in one transfer, a host sync. TrainingDiverged if a loss was not finite."""
        also = also or {}
        recent, first_nonfinite, *values = read_back([self.recent, self.first_nonfinite, *also.values()])
        self.raise_if_diverged(int(first_nonfinite), where)
        self.recent.zero_()
        mean = recent / max(self.recent_count, 1)
        self.recent_count = 0
        return mean, dict(zip(also, values))

    def read_mean(self, where: str) -> float:
        """The mean loss of the stage (a host sync; NaN for a stage of no step); TrainingDiverged as read_recent."""
        if not self.count:
            return float("nan")
        self.check(where)
        return self.total.item() / self.count

    def check(self, where: str) -> None:
        self.raise_if_diverged(int(self.first_nonfinite), where)

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """The sums (device tensors) and counts so far, which a checkpoint inside the stage keeps (load_state)."""
        return ({"total": self.total, "recent": self.recent, "first_nonfinite": self.first_nonfinite},
                {"count": self.count, "recent_count": self.recent_count})

    def load_state(self, tensors: dict[str, torch.Tensor], counts: dict[str, int]) -> None:
        for name, tensor in tensors.items():
            getattr(self, name).copy_(tensor)
        self.count, self.recent_count = counts["count"], counts["recent_count"]

    @staticmethod
    def raise_if_diverged(update: int, where: str) -> None:
        if update >= 0:
            raise TrainingDiverged(f"training diverged in {where}: the loss of update {update + 1} of the run is not "
                                   "finite; nothing after the last checkpoint is saved. Lower --lr and rerun")


def read_line(losses: StageLosses, where: str, tasks: DeviceSums, penalties: DeviceSums, learning_rate: float,
              grad_norm: torch.Tensor) -> dict:
    """The fields of a line of steps.jsonl from the summed values since the last one, read back in one transfer,
    the sums cleared after: the tasks trained ("task"), the mean loss, each task's mean loss when there are
    several, the learning rate (the base rate of the last update, which parameter groups scale), the last update's
    gradient norm (before clipping) and each penalty's mean. TrainingDiverged if a loss was not finite."""
    values = {("task", name): value for name, value in tasks.sums.items()}
    values |= {("penalty", name): value for name, value in penalties.sums.items()}
    values["grad_norm"] = grad_norm
    loss, read = losses.read_recent(where, values)
    line = {"task": ",".join(tasks.sums), "loss": loss}
    if len(tasks.sums) > 1:
        line["task_loss"] = {name: read["task", name] / tasks.counts[name] for name in tasks.sums}
    line |= {"lr": learning_rate, "grad_norm": read["grad_norm"]}
    line |= {name: read["penalty", name] / penalties.counts[name] for name in penalties.sums}
    tasks.clear()
    penalties.clear()
    return line


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
        atomic_write_text(self.steps_path, "".join(kept))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
