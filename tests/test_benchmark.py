"""scripts/benchmark.py end to end on tiny batches: every benchmark runs and reports sane figures.
The numbers themselves are measured on purpose-sized batches in BENCHMARKS.md, never asserted here."""
import json
import math
import multiprocessing
import re
from functools import partial

import benchmark  # the command line: scripts/ is on pytest's pythonpath
import pytest
import torch
import torch.multiprocessing

from base_bert import BertConfig
from conftest import DEMO
from minbert.benchmarks.command_line import BENCHMARKS, ON_THEIR_OWN, chosen_kinds, parse_args
from minbert.benchmarks.dev_eval import DEV_SUBSET
from minbert.benchmarks.host_syncs import copy_sync, counting, host_sync
from minbert.benchmarks.memory import MEMORY_ROWS, FloatMatmuls, LiveTensorBytes, peak_step_memory, step_memory
from minbert.benchmarks.models import build_encoders, make_batch, multitask_setup, random_twin
from minbert.benchmarks.settings import sixteen_bit
from minbert.benchmarks.throughput import PADDING_MULTIPLES
from minbert.benchmarks.timing import peak_flops, train_flops
from minbert.runtime import has_native_bf16

TINY_STEPS = ["--batch_size", "2", "--seq_len", "8", "--steps", "1", "--rounds", "1", "--warmup", "1", "--threads", "1"]


def run(tmp_path, *argv) -> dict:
    """The benchmarks' results by benchmark title, as --json writes them."""
    out = tmp_path / "results.jsonl"
    out.unlink(missing_ok=True)
    assert benchmark.main([*argv, "--data_dir", str(DEMO), "--json", str(out)]) == 0
    return {r["benchmark"]: r for r in map(json.loads, out.read_text().splitlines())}


def random_config(folder, vocab_size: int) -> str:
    """--config random:PATH of a 2-layer BERT of hidden size 32 with this vocabulary, its config.json in folder."""
    path = folder / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"vocab_size": vocab_size, "hidden_size": 32, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64}))
    return f"random:{path}"


@pytest.fixture
def tiny_config(tmp_path):
    return random_config(tmp_path / "tiny", vocab_size=1100)


@pytest.fixture
def tiny_config_for_text(tmp_path):
    """The tiny BERT with bert-base-uncased's vocabulary: the benchmarks that read real text (pipeline, ensemble)
    tokenize it with the bundled minilm-l6 tokenizer, whose ids need that vocabulary."""
    return random_config(tmp_path / "tiny-text", vocab_size=30522)


@pytest.fixture
def forkserver_workers(monkeypatch):
    """The memory probes (smart, adapters, checkpointing) and the data-parallel ranks start as fresh interpreters
    (spawn), each importing torch and torch._dynamo (AdamW imports it) again: 6-10 s apiece on 2 cores, eleven
    of them in one run of every benchmark. Here they fork from a forkserver that imported those once: still
    a process of their own (a peak resident size of the step alone; gloo ranks) and still pickled like spawn's.
    The spawn path itself is test_memory_probe_of_bert_base_random_needs_no_download's."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["minbert.benchmarks.command_line", "minbert.training.trainer",
                                    "minbert.distributed", "torch._dynamo"])
    monkeypatch.setattr(multiprocessing, "get_context", lambda method=None: context)
    monkeypatch.setattr(torch.multiprocessing, "spawn",
                        partial(torch.multiprocessing.start_processes, start_method="forkserver"))


def numbers(value):
    """Every number in a JSON value, however deeply nested (booleans are not figures)."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def test_a_benchmark_runs_in_float32(tmp_path, tiny_config_for_text):
    """BENCHMARKS.md's CPU figures are float32 ones (the smoke test below runs every kind in bf16): the encoder
    comparison in float32, on the tiny BERT."""
    (result,) = run(tmp_path, "encoder", "--precision", "fp32", "--config", tiny_config_for_text,
                    *TINY_STEPS).values()
    assert result["setup"]["precision"] == "fp32"
    figures = numbers({k: v for k, v in result.items() if k != "setup"})
    assert figures and all(math.isfinite(x) and x > 0 for x in figures if not isinstance(x, bool))


def test_every_benchmark_runs_under_bf16_autocast_on_cpu(tmp_path, tiny_config_for_text, forkserver_workers):
    """Every benchmark kind end to end under --bf16 (emulated on a CPU without native bf16), on the tiny BERT and
    one step of 2 x 8 tokens: what a kind reports, not how fast it is."""
    results = run(tmp_path, "all", "--bf16", "--config", tiny_config_for_text, *TINY_STEPS)
    kinds = chosen_kinds("all", torch.device("cpu"))
    assert set(kinds) == set(BENCHMARKS) - ON_THEIR_OWN and len(results) == len(kinds)
    # --bf16 is --precision bf16, and the setup says so; bf16 needs no gradient scaler (fp16's: below).
    assert all(r["setup"]["precision"] == "bf16" and "bf16 autocast" in r["setup"]["precision_notice"]
               for r in results.values())
    assert not any("fp16_skipped_steps" in r for r in results.values())
    by_kind = dict(zip(kinds, results.values()))  # "all" runs them in that order
    for kind, result in by_kind.items():  # times, sizes, memory, ratios: none negative, infinite or NaN
        figures = numbers({k: v for k, v in result.items() if k != "setup"})
        assert figures and all(math.isfinite(x) and x >= 0 for x in figures), kind
    ratios = [r[key] for r in results.values() for key in r if "ratio" in key or "speedup" in key]
    assert len(ratios) == 10 and all(x > 0 for x in ratios)
    assert all(t > 0 for r in results.values() for t in numbers(r.get("median_step_s", {})))
    # On the CPU, training's attention dropout rules out the fused kernel: the math path runs.
    assert by_kind["encoder"]["minbert_attention_kernel"] == "math"
    # model FLOPs utilisation beside every training-step time (on a CPU: against its measured matmul throughput)
    for kind in ("encoder", "precision", "smart"):
        assert by_kind[kind]["mfu"].keys() <= by_kind[kind]["median_step_s"].keys()
        assert all(0 < mfu for mfu in by_kind[kind]["mfu"].values())
        assert all("measured" in source for source in by_kind[kind]["mfu_peak"].values())
    # under bf16 a third side: the step reading --bf16_weights' copies
    assert set(by_kind["precision"]["median_step_s"]) == {"float32", "bf16_autocast", "bf16_weights"}
    assert by_kind["precision"]["speedup_bf16_weights_vs_casts"] > 0
    smart = by_kind["smart"]
    assert len(smart["smart_phase_s"]) == 5 and all(t > 0 for t in smart["smart_phase_s"].values())
    assert smart["peak_step_memory_mib"]["smart"] > 0 and smart["peak_step_memory_mib"]["plain"] > 0
    memory = by_kind["memory"]
    assert set(memory["rows"]) == set(MEMORY_ROWS) and memory["sixteen_bit"] == "bf16"
    assert all(v > 0 for row in memory["rows"].values() for k, v in row.items() if k.startswith("step_peak"))
    pipeline = by_kind["pipeline"]
    assert pipeline["batches"] == 1 and pipeline["real_tokens"] > 0 and pipeline["tokens_per_second"] > 0
    adapters = by_kind["adapters"]
    assert set(adapters["trainable_parameters"]) == set(adapters["peak_step_memory_mib"]) == {
        "full fine-tuning", "lora", "dora", "pals"}
    full, lora = adapters["trainable_parameters"]["full fine-tuning"], adapters["trainable_parameters"]["lora"]
    assert 0 < lora < full and adapters["checkpoint_mib"]["lora"] < adapters["checkpoint_mib"]["full fine-tuning"]
    assert all(v > 0 for v in adapters["peak_step_memory_mib"].values())
    assert set(by_kind["checkpointing"]["peak_step_memory_mib"]) == {"plain", "checkpointed"}
    data_parallel = by_kind["data_parallel"]["figures"]
    assert set(data_parallel) == {"1 process(es) x 1 thread(s)", "2 process(es) x 1 thread(s)"}
    assert all(f["examples_per_s"] > 0 for f in data_parallel.values())
    ensemble = by_kind["ensemble"]
    assert len(ensemble["per_split_s"]) == 6 and ensemble["one_model_inference_s"] > 0


@pytest.mark.slow  # compiles the whole step twice (about 15 s); step_audit's 0-break check stays in the fast tier
def test_the_captured_step_is_timed_against_the_eager_one(tmp_path, tiny_config, monkeypatch):
    """captured_step (asked for by name: on the CPU inductor's C++ compile takes minutes, so the test compiles with
    aot_eager; scripts/gpu_check.sh times CUDA graphs): both sides of the plain and of the SMART step timed, the
    captured one's backend reported."""
    import minbert.benchmarks.training_steps as training_steps
    monkeypatch.setattr(training_steps, "capture_backend", lambda device: ("aot_eager", None))
    (result,) = run(tmp_path, "captured_step", "--bf16", "--config", tiny_config, *TINY_STEPS).values()
    assert set(result["median_step_s"]) == {"eager", "captured", "smart_eager", "smart_captured"}
    assert result["capture"] == ["aot_eager", None] and all(t > 0 for t in result["median_step_s"].values())
    assert result["speedup_captured_vs_eager"] > 0 and result["smart_speedup_captured_vs_eager"] > 0
    assert result["smart_captured_cost_ratio"] > 1  # three passes or more against one


def test_fp16_steps_go_through_a_gradient_scaler(tmp_path, tiny_config):
    """As training's do: the precision benchmark reports the scaler's skipped steps (emulated fp16 on the CPU)."""
    (precision,) = run(tmp_path, "precision", "--precision", "fp16", "--config", tiny_config, *TINY_STEPS).values()
    assert precision["sixteen_bit"] == "fp16" and set(precision["median_step_s"]) == {"float32", "fp16_autocast"}
    assert precision["setup"]["precision"] == "fp16" and precision["fp16_skipped_steps"] >= 0
    assert math.isfinite(precision["speedup_16bit_vs_float32"])


def test_precision_flags_resolve_per_device():
    cpu_auto = "bf16" if has_native_bf16(torch.device("cpu")) else "fp32"
    assert parse_args(["encoder"]).precision == cpu_auto
    assert parse_args(["encoder", "--no-bf16"]).precision == "fp32"
    assert parse_args(["encoder", "--bf16", "--precision", "bf16"]).precision == "bf16"
    args = parse_args(["precision", "--precision", "fp16"])
    assert (args.precision, sixteen_bit(args, torch.device("cpu"))) == ("fp16", "fp16")
    assert sixteen_bit(parse_args(["precision"]), torch.device("cpu")) == "bf16"
    with pytest.raises(SystemExit):
        parse_args(["encoder", "--bf16", "--precision", "fp32"])


@pytest.mark.slow  # a fresh interpreter and a bert-base step: the real spawn path, in the full suite
def test_memory_probe_of_bert_base_random_needs_no_download(monkeypatch):
    """--config bert-base-random has random weights already: the CPU probe must not look it up as a checkpoint
    (it asked the hub for 'bert-base-random', which fails offline). A bert-base step of 1 x 8 tokens."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the spawned probe inherits it
    args = parse_args(["smart", "--config", "bert-base-random", "--batch_size", "1", "--seq_len", "8",
                                 "--threads", "1"])
    assert peak_step_memory(args, torch.device("cpu"), smart=False) > 0
    assert random_twin("bert-base-random") == "bert-base-random"
    assert random_twin("minilm-l6") == "random:minilm-l6"


def test_random_configs_give_both_encoders_the_same_weights(tiny_config):
    args = parse_args(["encoder", "--config", tiny_config])
    ours, reference = build_encoders(args, torch.device("cpu"))
    assert ours.config.hidden_size == reference.config.hidden_size == 32
    ids, mask = make_batch(2, 8, ours.config.vocab_size, torch.device("cpu"))
    ours.eval(), reference.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask)["last_hidden_state"] * mask[..., None],
                                   reference(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None],
                                   atol=1e-5, rtol=1e-5)


def test_live_tensor_counter_matches_a_hand_count():
    held = torch.ones(1000)  # before the counter: not counted, nor are its views and in-place results
    weight = torch.ones(64, requires_grad=True)
    with LiveTensorBytes() as counter:
        held.add_(1), held[10:].view(-1, 10)
        assert counter.current == 0
        a = torch.ones(256, 256)  # 262,144 bytes
        view = a[1:].t()  # a's storage: nothing more
        assert counter.current == 262_144
        b = a @ a  # another 262,144
        del a
        assert counter.current == 524_288  # the view keeps a's storage alive
        del view
        assert counter.current == 262_144
        c = b.double() * 2  # b.double(): 524,288, its product another 524,288, then the first is freed
        del b, c
        assert counter.current == 0 and counter.peak == 262_144 + 2 * 524_288
        (weight * weight).sum().backward()  # the backward's temporaries are freed; the gradient stays
        assert counter.current == 64 * 4 and weight.grad.untyped_storage().nbytes() == 256
        weight.grad = None
        assert counter.current == 0
    assert "mm" in counter.names and "mul" in counter.names


def test_memory_benchmark_orders_the_steps(tmp_path, tiny_config):
    (memory,) = run(tmp_path, "memory", "--config", tiny_config, "--batch_size", "4", "--seq_len", "32",
                    "--threads", "1").values()
    rows = memory["rows"]
    for variant in ("fused_attention", "attention_as_run_here"):
        peak = {name: row[f"step_peak_mib_{variant}"] for name, row in rows.items()}
        assert peak["SMART"] > peak["plain"] > 0
        assert peak["plain, checkpointing"] < peak["plain"] and peak["SMART, checkpointing"] < peak["SMART"]
        assert peak["plain, 16-bit"] < peak["plain"]
    # The CPU's math attention keeps (B, heads, T, T) tensors that a fused kernel does not.
    assert rows["plain"]["step_peak_mib_fused_attention"] < rows["plain"]["step_peak_mib_attention_as_run_here"]
    assert memory["attention_kernels"] == {"fused_attention": "_scaled_dot_product_flash_attention_for_cpu",
                                           "attention_as_run_here": "math"}


def test_step_memory_counts_the_static_tensors(tiny_config):
    args = parse_args(["memory", "--config", tiny_config, "--batch_size", "2", "--seq_len", "16"])
    figures = step_memory(args, torch.device("cpu"), smart=True, checkpointing=False, precision="fp32",
                                    fused_attention=True)
    model = multitask_setup(args, torch.device("cpu"), False)[0]
    parameters = 4 * sum(p.numel() for p in model.parameters())
    assert figures["weights"] == figures["smart_teacher_copy"] == parameters  # float32, all trainable
    # A QQP SBERT step (mean pooling) gives no gradient to the pooler nor to SST's head.
    unused = 4 * sum(p.numel() for name, p in model.named_parameters() if "pooler" in name or "sentiment" in name)
    assert figures["gradients"] == parameters - unused > 0.9 * parameters
    # exp_avg and exp_avg_sq of what has trained, and its step counts where AdamW keeps them as float64 tensors
    trained = [p for name, p in model.named_parameters() if "pooler" not in name and "sentiment" not in name]
    assert figures["adamw_states"] - 2 * figures["gradients"] in (0, 8 * len(trained))
    assert figures["step_peak"] > figures["gradients"]  # the step makes the gradients and more


def test_float_matmuls_count_the_bytes_of_the_16_bit_kernels(tiny_config):
    """The memory benchmark's stand-in for emulated 16-bit matmuls makes the same tensors as the real kernels."""
    args = parse_args(["memory", "--config", tiny_config, "--batch_size", "2", "--seq_len", "16"])
    for fused in (True, False):
        real, stand_in = (step_memory(args, torch.device("cpu"), False, False, "bf16", fused, float_matmuls)
                          for float_matmuls in (False, True))
        assert stand_in["step_peak"] == real["step_peak"] > 0 and stand_in["attention"] == real["attention"]
    a, b = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, 4, dtype=torch.bfloat16)
    with FloatMatmuls():
        product = a @ b
    assert product.dtype == torch.bfloat16 and torch.equal(product, (a.float() @ b.float()).bfloat16())


# -- step_audit ------------------------------------------------------------------------------------

def syncing_function(x):
    """Reads x back to the host in every way the audit counts on the CPU."""
    return bool((x > 0).all()), x.sum().item(), x.nonzero(), x[x > 0], x.tolist()


def test_the_step_counter_counts_every_operator_and_each_host_sync_where_it_is_called():
    x = torch.arange(6.0)
    with counting(torch.device("cpu")) as quiet:
        (x * 2 + 1).sum()  # mul, add, sum: nothing read back
    assert quiet.ops == 3 and quiet.host_syncs == 0
    with counting(torch.device("cpu")) as count:
        syncing_function(x)
    line = syncing_function.__code__.co_firstlineno + 2  # its return statement
    where = f"tests/test_benchmark.py:{line} (syncing_function)"
    assert dict(count.syncs) == {
        ("aten::_local_scalar_dense", where): 2,  # bool() and item()
        ("aten::nonzero", where): 1,
        ("aten::index with a boolean mask (a nonzero inside)", where): 1,
        ("Tensor.tolist() (a device-to-host copy on a GPU)", where): 1}
    assert count.host_syncs == 5 and count.ops == count.operators.total() >= 7
    weight = torch.nn.Parameter(torch.ones(2, 3))
    with counting(torch.device("cpu"), [weight]) as casts:
        weight.to(torch.bfloat16), weight[0].to(torch.bfloat16)  # the weight and a view of it: cast
        torch.empty(3, dtype=torch.bfloat16).copy_(weight[1])  # a copy into another dtype: cast
        weight.to(torch.float32), weight.detach().clone(), (weight * 2).to(torch.bfloat16)  # none of them a cast
    assert casts.weight_casts == 3 and casts.views >= 3  # weight[0], weight[1], detach


def test_copies_and_reads_count_as_syncs_only_where_they_make_the_host_wait():
    """A meta tensor stands for a GPU's: a copy to the host waits, and one to the device unless it is non-blocking
    from pinned memory (which this CPU build cannot make); audited on CUDA, reading a CPU tensor waits for nothing."""
    host, device = torch.ones(2), torch.empty(2, device="meta")
    assert copy_sync("copy_", (host, device), {}, None) == "device-to-host copy (aten::copy_)"
    assert copy_sync("_to_copy", (device,), {}, host) == "device-to-host copy (aten::_to_copy)"
    assert copy_sync("copy_", (device, host), {}, None) == "blocking host-to-device copy (aten::copy_)"
    assert copy_sync("_to_copy", (host,), {"non_blocking": True}, device) == \
        "host-to-device copy from pageable memory (aten::_to_copy)"
    assert copy_sync("copy_", (host, torch.zeros(2)), {}, None) is None
    read = torch.ops.aten._local_scalar_dense.default
    assert host_sync(read, (torch.ones(()),), {}, 1.0, torch.device("cuda")) is None
    assert host_sync(read, (torch.ones((), device="meta"),), {}, 1.0, torch.device("cuda")) == \
        "aten::_local_scalar_dense"


def deliberate_sync():
    return torch.ones(1).item()


def test_step_audit_ends_with_its_two_summary_lines(tmp_path, tiny_config_for_text, capsys, monkeypatch):
    """One plain and one SMART step of the tiny BERT built by the training command line on the demo data: the
    counts in the last two lines are the --json line's, and every sync is listed above them. A sync added to the
    optimizer step is counted once per audited step: the warm-up step before it is not counted."""
    from minbert.training.loop import StepLoop
    optimizer_step = StepLoop.optimizer_step

    def optimizer_step_with_a_sync(self, *args, **kwargs):
        result = optimizer_step(self, *args, **kwargs)
        deliberate_sync()
        return result
    monkeypatch.setattr(StepLoop, "optimizer_step", optimizer_step_with_a_sync)
    out = tmp_path / "audit.jsonl"
    assert benchmark.main(["step_audit", "--config", tiny_config_for_text, "--batch_size", "4", "--seq_len", "16",
                           "--threads", "1", "--data_dir", str(DEMO), "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    result = json.loads(out.read_text())
    plain, smart = result["plain_step"], result["smart_step"]
    assert lines[-2] == (f"plain step: host syncs {plain['host_syncs']}, ops {plain['ops']} (views {plain['views']}), "
                         f"weight casts {plain['weight_casts']}, graph breaks {plain['graph_breaks']}")
    assert lines[-1] == (f"smart step: host syncs {smart['host_syncs']}, ops {smart['ops']} (views {smart['views']}), "
                         f"weight casts {smart['weight_casts']}, graph breaks of the whole step as --capture_step "
                         f"compiles it {smart['graph_breaks_whole_step']}")
    assert re.fullmatch(r"plain step: host syncs \d+, ops \d+ \(views \d+\), weight casts \d+, graph breaks \d+",
                        lines[-2])
    assert re.fullmatch(r"smart step: host syncs \d+, ops \d+ \(views \d+\), weight casts \d+, graph breaks of the "
                        r"whole step as --capture_step compiles it \d+", lines[-1])
    # The run's precision is auto: bf16 where this CPU computes it natively, where --bf16_weights is counted too.
    assert re.fullmatch(r"plain step with --bf16_weights: (host syncs \d+, ops \d+ \(views \d+\), weight casts \d+"
                        r"|not counted \(the option needs bf16 autocast; the plain step's precision is fp32\))",
                        lines[-3])
    assert plain["task"] == smart["task"] == "qqp" and plain["batch_shapes"]["input_ids_1"][0] == 4
    assert "--smart" in smart["training_argv"] and "--smart" not in plain["training_argv"]
    assert smart["ops"] > plain["ops"] > 0 and any(op.endswith("_backward") for op in plain["operators"])
    deliberate = {"what": "aten::_local_scalar_dense", "times": 1,
                  "where": f"tests/test_benchmark.py:{deliberate_sync.__code__.co_firstlineno + 1} (deliberate_sync)"}
    for name, step in (("plain", plain), ("smart", smart)):
        assert deliberate in step["host_syncs_by_site"]
        assert sum(site["times"] for site in step["host_syncs_by_site"]) == step["host_syncs"]
        listed = [line for line in lines if line.startswith(f"{name} step sync: ")]
        assert len(listed) == len(step["host_syncs_by_site"])
    assert plain["graph_breaks"] >= 0 and plain["graph_breaks_loss_computation"] >= 0
    graph_line = next(line for line in lines[:-2] if line.startswith("graph breaks (torch._dynamo.explain"))
    # the whole step, the backward and AdamW's update included, as --capture_step compiles it (issue 60, item 1)
    assert plain["graph_breaks_whole_step"] == 0, plain["graph_break_reasons_whole_step"]
    # SMART's too: its ascent, its perturbed and anchor passes and its finiteness decision on the device
    assert smart["graph_breaks_whole_step"] == 0, smart["graph_break_reasons_whole_step"]
    assert graph_line.endswith("the whole step as --capture_step compiles it (backward and AdamW's update included) 0")


def test_step_audit_under_bf16_counts_the_weight_casts_that_bf16_weights_removes(tmp_path, tiny_config_for_text):
    """Under bf16 autocast the plain step casts every nn.Linear weight and bias to bf16; with --bf16_weights it
    casts none and dispatches fewer operators that are not views (those launch kernels on a GPU). The model's
    forward, and its forward and loss, trace as one graph each. bf16 autocast runs on any CPU (emulated without
    native bf16)."""
    result = run(tmp_path, "step_audit", "--config", tiny_config_for_text, "--precision", "bf16", "--batch_size", "4",
                 "--seq_len", "16", "--threads", "1")["step_audit: host syncs, aten operators and graph breaks of one "
                                                       "training step"]
    plain, copies = result["plain_step"], result["plain_step_bf16_weights"]
    assert plain["precision"] == copies["precision"] == "bf16" and "--bf16_weights" in copies["training_argv"]
    assert plain["weight_casts"] > 0 and result["smart_step"]["weight_casts"] > 0
    assert copies["weight_casts"] == 0
    assert copies["ops"] - copies["views"] < plain["ops"] - plain["views"]
    assert copies["operators"].get("aten::_to_copy", 0) < plain["operators"]["aten::_to_copy"]
    assert plain["graph_breaks"] == 0, plain["graph_break_reasons"]
    assert plain["graph_breaks_forward_and_loss"] == 0, plain["graph_break_reasons_forward_and_loss"]
    assert plain["graph_breaks_whole_step"] == 0, plain["graph_break_reasons_whole_step"]  # under bf16 autocast


# -- bad flags: one line naming the flag, exit code 2, before anything loads -------------------------

def refused(capsys, *argv) -> str:
    """The one line of stderr with which the benchmark refuses argv (exit code 2)."""
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(list(argv))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    return error


@pytest.mark.parametrize("argv, message", [
    (["captured_step", "--precision", "fp16"], "--precision fp16 is fp16 here: --capture_step refuses fp16"),
    (["encoder", "--batch_size", "0"], "argument --batch_size: must be >= 1, got 0"),
    (["encoder", "--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["encoder", "--rounds", "0"], "argument --rounds: must be >= 1, got 0"),
    (["encoder", "--warmup", "-1"], "argument --warmup: must be >= 0, got -1"),
    (["encoder", "--threads", "0"], "argument --threads: must be >= 1, got 0"),
    (["encoder", "--batch_size", "two"], "argument --batch_size: expected a whole number, got 'two'"),
    (["encoder", "--seq_len", "100000"], "--seq_len 100000 is longer than the 512 positions of minilm-l6"),
    (["encoder", "--seq_len", "1"], "--seq_len must be >= 2 for encoder, got 1"),
    (["pipeline", "--seq_len", "2"], "--seq_len must be >= 3 for pipeline, got 2"),
    (["step_audit", "--seq_len", "4"], "--seq_len must be >= 5 for step_audit, got 4"),
    (["encoder", "--device", "tpu"], "argument --device: 'tpu' is not a device"),
    (["encoder", "--device", "mps"], "argument --device: the benchmarks run on cpu or cuda, not mps"),
    (["encoder", "--config", "/no/such/checkpoint"], "--config /no/such/checkpoint: "),
    (["encoder", "--config", "random:/no/such/config.json"], "--config random:/no/such/config.json: "),
    (["pipeline", "--data_dir", "/no/such/folder"], "--data_dir /no/such/folder: not a folder"),
    (["ensemble", "--data_dir", str(DEMO.parent)], f"--data_dir {DEMO.parent}: no quora-dev.csv there"),
    (["data_parallel", "--batch_size", "1"], "--batch_size 1: data_parallel splits it over 2 processes"),
    (["encoder", "--json", str(DEMO)], f"--json {DEMO}: a folder, not a file"),
    (["step_audit", "--train_flags", "--lr 0"], "--lr must be a finite number > 0, got 0.0"),
    (["step_audit", "--train_flags=--compile"], "--train_flags --compile: torch.compile does not run under"),
    (["encoder", "--compile_mode", "reduce-overhead"], "--compile_mode reduce-overhead: only with --compile"),
])
def test_a_bad_flag_is_one_line_and_exit_code_2(capsys, argv, message):
    assert message in refused(capsys, *argv)


def test_cuda_without_cuda_is_refused_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert "argument --device: cuda: torch sees no CUDA device" in refused(capsys, "smart", "--device", "cuda")


def test_a_vocabulary_the_model_cannot_embed_is_refused_for_real_text(capsys, tiny_config):
    """The tiny config's 1,100-row embedding table cannot take the bert-base-uncased tokenizer's ids."""
    error = refused(capsys, "pipeline", "--config", tiny_config, "--data_dir", str(DEMO))
    assert f"--config {tiny_config}: " in error and "embedding table has 1100 rows" in error


def test_the_squad_peer_refuses_bad_flags_in_one_line(capsys, tmp_path):
    assert "--data_dir /no/such/folder: no train-v2.0.json there" in refused(
        capsys, "qa_peer", "--data_dir", "/no/such/folder")
    assert "--max_length 1000 is longer than the 512 positions of minilm-l6" in refused(
        capsys, "qa_peer", "--data_dir", str(DEMO), "--max_length", "1000")
    assert f"--out {tmp_path}: a folder, not a file" in refused(
        capsys, "qa_peer", "--data_dir", str(DEMO), "--out", str(tmp_path))
    assert "argument --batch_size: invalid int value" in refused(capsys, "qa_peer", "--batch_size", "x")


def test_train_flops_count_the_weights_per_real_token_and_the_attention_per_sequence():
    config = BertConfig(vocab_size=100, hidden_size=4, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=8)
    weights = 2 * (4 * 16 + 2 * 4 * 8) + 16  # two layers' Q, K, V, output and feed-forward matrices, the pooler
    assert train_flops(config, [3, 1]) == 6 * weights * 4 + 12 * 2 * 4 * (9 + 1)
    peak, source = peak_flops(torch.device("cpu"), "fp32", 1)
    assert peak > 0 and "measured" in source


def test_known_gpus_have_published_peaks_per_precision(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L4")
    assert peak_flops(torch.device("cuda"), "bf16", 1)[0] == 121e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    assert peak_flops(torch.device("cuda"), "fp16", 1)[0] == 65e12
    assert peak_flops(torch.device("cuda"), "bf16", 1)[0] is None  # no bf16 tensor cores
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert peak_flops(torch.device("cuda"), "fp32", 1)[0] == 378e12


def test_padding_counts_the_grid_tokens_of_each_bucket_size(tmp_path, tiny_config_for_text):
    (result,) = run(tmp_path, "padding", "--config", tiny_config_for_text, "--batch_size", "8", "--seq_len",
                    "32").values()
    for task, counts in result["tasks"].items():
        grids = [counts["longest"], *(counts[f"multiple_{m}"] for m in PADDING_MULTIPLES)]
        assert 0 < counts["real"] <= grids[0] <= grids[1] <= grids[2] <= grids[3], task
        assert counts["widths"]["multiple_32"] == 1 <= counts["widths"]["multiple_8"] <= counts["widths"]["longest"]
    assert result["tokens_vs_longest"]["longest"] == 1.0


def test_dev_eval_times_every_dev_example_against_the_capped_subset(tmp_path, tiny_config_for_text):
    (result,) = run(tmp_path, "dev_eval", "--config", tiny_config_for_text, "--batch_size", "8", "--seq_len", "16",
                    "--rounds", "2", "--threads", "1").values()
    assert result["dev_examples"] == {"sst": 40, "qqp": 40, "sts": 40}
    assert set(result["seconds"]) == {"all", f"max_eval_examples {DEV_SUBSET}"}
    assert all(len(times) == 2 and min(times) > 0 for times in result["seconds"].values())


def test_qqp_epoch_times_real_smart_steps_and_scales_them_to_the_course_epoch(tmp_path, tiny_config_for_text):
    (result,) = run(tmp_path, "qqp_epoch", "--config", tiny_config_for_text, "--batch_size", "4", "--seq_len", "16",
                    "--steps", "2", "--rounds", "1", "--warmup", "1", "--threads", "1").values()
    assert result["timed_steps"] == 2 and result["epoch_steps"] == math.ceil(141_506 / 4)
    assert result["epoch_hours"] == pytest.approx(result["step_s"] * result["epoch_steps"] / 3600, rel=1e-2)
    assert result["smart_precision"] == "run" and "implied_l4_epoch_hours_estimate" not in result  # a CPU


def test_the_encoder_benchmark_compiles_minbert_and_times_transformers_compiled(tmp_path, tiny_config):
    import torch._dynamo
    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as patch:  # the graphs without code generation: seconds, not minutes
        original = torch.compile
        patch.setattr(torch, "compile", lambda *a, **k: original(*a, **{**k, "backend": "aot_eager"}))
        (result,) = run(tmp_path, "encoder", "--precision", "fp32", "--config", tiny_config, "--compile",
                        "--token_layout", "padded", *TINY_STEPS).values()
    assert set(result["median_step_s"]) == {"minbert", "transformers", "transformers_compiled"}
    assert result["speedup_minbert_vs_transformers_compiled"] > 0 and result["setup"]["compile"]
    assert result["setup"]["token_layout"] == "padded"


def test_the_encoder_benchmark_compiles_minbert_in_the_mode_asked(tmp_path, tiny_config):
    import torch._dynamo
    torch._dynamo.reset()
    modes = []
    with pytest.MonkeyPatch.context() as patch:  # record the mode, compile without code generation or CUDA graphs
        original = torch.compile

        def recording(*args, **kwargs):
            modes.append(kwargs.get("mode"))
            return original(*args, **{**kwargs, "mode": None, "backend": "aot_eager"})
        patch.setattr(torch, "compile", recording)
        (result,) = run(tmp_path, "encoder", "--precision", "fp32", "--config", tiny_config, "--compile",
                        "--compile_mode", "reduce-overhead", *TINY_STEPS).values()
    assert modes[0] == "reduce-overhead"  # minBERT's layers; transformers is compiled in torch's default mode
    assert result["benchmark"].endswith("minBERT compiled (reduce-overhead)")
    assert result["setup"]["compile_mode"] == "reduce-overhead"
