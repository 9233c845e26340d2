"""Data parallel training under torchrun: one process per device, each on its own shard of every batch.

    torchrun --standalone --nproc_per_node 4 multitask_classifier.py --use_gpu ...

`Distributed.from_environment` reads torchrun's RANK / LOCAL_RANK / WORLD_SIZE (absent: one process,
exactly as without this module) and joins the process group, NCCL on CUDA and gloo on the CPU.

Gradients are averaged by an explicit all-reduce once per optimizer step rather than by the
DistributedDataParallel wrapper: the model is driven through several entry points per step (SMART's
perturbed forwards, the Bregman teacher, one backward per task for gradient surgery, LNSR's noisy
pass), which DDP's forward-hooked reducer does not see. Reducing once per step is what DDP's
`no_sync` gives for gradient accumulation, and per-task gradients are reduced before the surgery.

Every rank builds the same batches from the same seed and keeps its slice (`shard_batch`), so an
epoch shows each example exactly once across ranks; the global batch is the per-rank batch times
the number of processes. A rank's loss is weighted by its share of the global batch (`share`),
which makes the averaged gradient that of the whole global batch even when the slices differ by
one example.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from minbert.runtime import resolve_device

# How long a rank waits in a collective before the run is aborted. After every stage rank 0 alone writes the
# best model and the training state (bert-base: 110M float32 weights, AdamW's two moments and SMART's anchor, about 1.8 GB) while the
# others wait at a barrier; on Colab's Google Drive that write can take minutes, past NCCL's 10-minute default.
PROCESS_GROUP_TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone prints, logs and writes files."""
        return self.rank == 0

    @classmethod
    def from_environment(cls, use_gpu: bool) -> tuple[Distributed, torch.device]:
        """The process group torchrun describes (joined here) and this process's device; one process
        and `resolve_device(use_gpu)` when not started by torchrun."""
        if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
            return cls(), resolve_device(use_gpu)
        context = cls(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
        device = resolve_device(use_gpu)
        if device.type == "cuda":
            device = torch.device("cuda", context.local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=PROCESS_GROUP_TIMEOUT)
        return context, device

    @contextlib.contextmanager
    def main_process_output(self):
        """Rank 0 prints and warns; the other ranks' stdout and warnings (the same lines) are dropped.
        Errors still reach every rank's stderr."""
        if self.is_main:
            yield
            return
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield

    # -- collectives (each a no-op for one process) ----------------------------------------------------
    def share(self, count: int | torch.Tensor, device: torch.device) -> float | torch.Tensor:
        """count * world_size / (sum of count over ranks): the weight that turns a rank's mean loss into
        its part of the global batch's mean once gradients are averaged. Under torchrun a 0-dim tensor on the
        device, so that the step never waits for the all-reduce (`count` may be one too: mlm's masked tokens)."""
        if not self.enabled:
            return 1.0
        count = torch.as_tensor(count, dtype=torch.float32, device=device).reshape(())
        total = count.clone()
        dist.all_reduce(total)
        return count * self.world_size / total

    def average_gradients(self, parameters) -> None:
        """Average .grad over ranks with one all-reduce of the flattened gradients. A parameter with a
        gradient on some rank only takes part as zeros on the others; one with a gradient on no rank
        keeps None, so that the optimizer skips it as it would in one process."""
        if not self.enabled:
            return
        parameters = [p for p in parameters if p.requires_grad]
        if not parameters:
            return
        has_gradient = torch.tensor([p.grad is not None for p in parameters], dtype=torch.float32,
                                    device=parameters[0].device)
        dist.all_reduce(has_gradient)
        parameters = [p for p, flag in zip(parameters, has_gradient.tolist()) if flag > 0]
        if not parameters:
            return
        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for p, averaged in zip(parameters, self.average_tensors([p.grad for p in parameters])):
            p.grad.copy_(averaged)

    def average_tensors(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The mean over ranks of same-shaped tensor lists (gradients), with one all-reduce of them flattened."""
        if not self.enabled or not tensors:
            return tensors
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        dist.all_reduce(flat)
        flat /= self.world_size
        averaged, offset = [], 0
        for t in tensors:
            averaged.append(flat[offset:offset + t.numel()].view_as(t).to(t.dtype))
            offset += t.numel()
        return averaged

    def start_from_one_model(self, modules: list[torch.nn.Module | None], seed: int) -> None:
        """Rank 0's weights (and buffers) on every rank, then a dropout stream of each rank's own (seed + rank):
        one starting model, different masks."""
        if not self.enabled:
            return
        for module in filter(None, modules):
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)
        torch.manual_seed(seed + self.rank)

    def gather_with_grad(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x concatenated along dim 0, in rank order; gradients flow into this rank's own
        slice (the others are constants here and get theirs on their own rank), as in-batch negatives
        across devices need. Slices may differ in length."""
        if not self.enabled:
            return x
        sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([x.shape[0]], device=x.device))
        sizes = [int(s.item()) for s in sizes]
        padded = x.new_zeros((max(sizes), *x.shape[1:]))
        padded[:x.shape[0]] = x.detach()
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded)
        parts = [g[:n] for g, n in zip(gathered, sizes)]
        parts[self.rank] = x
        return torch.cat(parts)

    def gather_objects(self, value) -> list:
        """Every rank's picklable value, in rank order (used for ids and predictions, never for files)."""
        if not self.enabled:
            return [value]
        values = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def main_decides(self, value):
        """Rank 0's picklable value on every rank: a decision only rank 0 can make (by its clock) that every rank
        must act on together."""
        if not self.enabled:
            return value
        values = [value]
        dist.broadcast_object_list(values, src=0)
        return values[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def shutdown(self, failed: bool = False) -> None:
        """Leaves the process group. After a barrier, so that no rank tears its gloo connections down while another
        still uses them (a two-process run once ended in one rank's SIGABRT); not after a failure, where the other
        ranks would never reach the barrier (torchrun or mp.spawn stops them)."""
        if self.enabled and dist.is_initialized():
            if not failed:
                dist.barrier()
            dist.destroy_process_group()


SINGLE_PROCESS = Distributed()


@contextlib.contextmanager
def leaving_together(distributed: Distributed):
    """Leaves the process group on every way out of the block: together with the other ranks when it ends, at once
    when it raises. A process that exits still in a gloo group can abort (SIGABRT) while the interpreter shuts
    down, as gloo's threads release the tensors they hold, which hides the error that ended it."""
    try:
        yield distributed
    except BaseException:
        distributed.shutdown(failed=True)
        raise
    distributed.shutdown()


@contextlib.contextmanager
def data_parallel(use_gpu: bool):
    """(distributed, device) for a command line's run: the process group torchrun describes (or one
    process), rank 0's output only, and the group left at the end."""
    distributed, device = Distributed.from_environment(use_gpu)
    with leaving_together(distributed), distributed.main_process_output():
        yield distributed, device


def shard_batch(indices: list[int], world_size: int, rank: int) -> list[int]:
    """This rank's slice of a global batch: every world_size-th index, so that slices of a length-sorted
    batch have similar lengths and sizes that differ by at most one."""
    return indices[rank::world_size]


def cut_global_batches(indices: list[int], batch_size: int, world_size: int) -> list[list[int]]:
    """indices cut into global batches of batch_size * world_size; a last batch with fewer examples than
    ranks joins the one before it, so that no rank's slice is empty. One process: plain batches."""
    size = batch_size * world_size
    batches = [indices[start:start + size] for start in range(0, len(indices), size)]
    if len(batches) > 1 and len(batches[-1]) < world_size:
        tail = batches.pop()
        batches[-1] += tail
    if batches and len(batches[0]) < world_size:
        raise ValueError(f"{len(indices)} examples cannot be shared by {world_size} processes")
    return batches


def global_batch_count(num_examples: int, batch_size: int, world_size: int) -> int:
    """How many global batches cut_global_batches makes of num_examples (the steps of an epoch)."""
    return len(cut_global_batches(list(range(num_examples)), batch_size, world_size))
