"""--capture_step: a task batch's whole training step as one graph that torch.compile captures (fullgraph: a graph
break is an error, never a silent split), once per (task, batch shape): the forward, the loss, the backward, the
clipping (or the gradients' norm) and AdamW's update. On CUDA it runs as CUDA graphs (mode "reduce-overhead"): the
step is one replay, no kernel launched from Python. The host keeps what must stay on it: the token layout, built
from the rows' lengths before the call (padded, so that a step's shapes are the batch's (B, T), which length
buckets make repeat), and the learning rate, a tensor it fills in place (nothing recompiles when it changes).

    step = CapturedStep(model, optimizer, amp, max_grad_norm, backend, mode)
    loss, terms, norm = step(objective, batch, learning_rate)        # the update taken

torch 2.13's dynamo traces `loss.backward()` into the graph (as autograd.grad and the gradients' accumulation)
under its `trace_autograd_ops` setting, which the call turns on for itself; AdamW's update reads only tensors
(optimizer.py), so it traces too. SMART's step is captured whole: its ascent (autograd.grad on the perturbation),
its perturbed and anchor passes, and its finiteness decision, which stays on the device inside the graph
(smart.adversarial_regularizer), its dropped terms counted there; the anchor's moving average follows each update
outside the graph, as in the eager loop. What it cannot serve is refused with the flag (training_args): a step that
reads a value back to decide (fp16's loss scale), several batches per update (accumulation, gradient surgery,
torchrun's averaging), and what was never checked inside one graph (the other penalties: PenaltyKind.captured).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from minbert.model.multitask_bert import MultitaskBERT
from minbert.runtime import full_float32_matmuls
from minbert.training.optimization import gradient_norm, set_learning_rate
from optimizer import AdamW

# Each (task, batch shape) is a graph of its own: length buckets of 8 tokens up to 512, with a key mask or without
# (a batch with no padded row needs none) and the last short batch of a stage, for each task, stay far under this.
# Past it torch.compile would run the step eagerly (the same step, uncaptured) with no more than a logged warning.
RECOMPILE_LIMIT = 1024


def capture_backend(device: torch.device) -> tuple[str, str | None]:
    """torch.compile's backend and mode for the device: CUDA graphs of inductor's kernels on CUDA, inductor's C++
    elsewhere."""
    return ("inductor", "reduce-overhead") if device.type == "cuda" else ("inductor", None)


class CapturedStep:
    """One update of `model` by `optimizer` on a task batch, compiled whole (see the module's docstring): called
    with a task's objective (objective.TaskObjective), the batch on the device and the base learning rate, it
    returns the loss (detached), its penalties' terms and the gradients' norm before clipping (0-dim tensors on the
    device, the loop's to keep: under CUDA graphs the next replay overwrites the graph's own outputs, so they are
    copied out)."""

    def __init__(self, model: MultitaskBERT, optimizer: AdamW, amp, max_grad_norm: float, backend: str = "inductor",
                 mode: str | None = None):
        self.model, self.optimizer, self.amp, self.max_grad_norm = model, optimizer, amp, max_grad_norm
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.device = self.params[0].device
        self.cuda_graphs = mode == "reduce-overhead"
        self.prepared_tasks: set[str] = set()
        # dynamic=False: a new length bucket is a graph of its own, never one graph of symbolic lengths (CUDA graphs
        # record one per shape anyway).
        self.compiled = torch.compile(self.step, fullgraph=True, dynamic=False, backend=backend, mode=mode)

    def __call__(self, objective, batch: dict, learning_rate: float) -> tuple[torch.Tensor, dict, torch.Tensor]:
        arguments = self.prepare(objective, batch, learning_rate)
        if self.cuda_graphs:  # a new iteration: the last replay's outputs may be overwritten now
            torch.compiler.cudagraph_mark_step_begin()
        # SMART's exact float32: its autocast is off inside the graph, the matmuls' precision (global state) here,
        # for the whole step (the eager step's backward keeps the run's: TF32 on CUDA)
        exact = objective.computes_exactly(self.device.type)
        with capturing(), full_float32_matmuls() if exact else nullcontext():
            loss, terms, norm = self.compiled(*arguments)
        return loss.clone(), {name: term.clone() for name, term in terms.items()}, norm.clone()

    def prepare(self, objective, batch: dict, learning_rate: float) -> tuple:
        """The host's part of the step, before the graph: the optimizer's states (once), the task's adapters, the
        token layout from the rows' lengths and the learning rate set in place; returns step()'s arguments."""
        if len(self.optimizer.state) < len(self.params):  # the first call, or a checkpoint loaded since
            self.prepare_states()
        if objective.task not in self.prepared_tasks:  # its penalties' tensors (SMART's anchor and counter)
            for penalty in objective.penalties:
                for tensor in penalty.device_tensors():
                    torch._dynamo.mark_static_address(tensor)
            self.prepared_tasks.add(objective.task)
        self.model.set_adapter(objective.task)
        inputs = self.model.encoder_inputs(objective.task, batch)
        tensors = {key: value for key, value in batch.items() if torch.is_tensor(value)}  # not the host's lengths
        set_learning_rate(self.optimizer, learning_rate)
        return objective, tensors, inputs

    def prepare_states(self) -> None:
        """Every parameter's AdamW state created now (as its first gradient would), so that no graph creates one and
        each reads the same tensors; marked as staying where they are, which CUDA graphs need of what they
        update in place. At the first call, after a resume has loaded the optimizer (whose checkpoint leaves out the
        states no step has moved: model/checkpoint.optimizer_state), and again after a checkpoint is loaded."""
        for param in self.params:
            for value in self.optimizer.initial_state(param).values():
                torch._dynamo.mark_static_address(value)

    def step(self, objective, batch: dict, inputs) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """What torch.compile captures: the eager loop's step for one batch and its update (StepLoop.run_steps,
        optimization.update_weights), without the host's part."""
        with self.amp:
            loss, terms = objective(self.model, batch, inputs)
        value = loss.detach()  # the graph returns no tensor whose autograd graph its backward consumed
        if loss.requires_grad:  # not so for the SBERT cosine with --option pretrain: no trainable weight
            loss.backward()
        if self.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        else:
            norm = gradient_norm(self.params, self.device)
        self.optimizer.step()
        for param in self.params:  # optimizer.zero_grad(set_to_none=True), which dynamo does not trace
            param.grad = None
        return value, terms, norm


def capturing():
    """The settings torch.compile traces the step under (a context): the backward traced into the graph, and room
    for every (task, shape) graph."""
    return torch._dynamo.config.patch(trace_autograd_ops=True, recompile_limit=RECOMPILE_LIMIT)
