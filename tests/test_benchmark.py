"""scripts/benchmark.py end to end on tiny batches: every benchmark runs and reports sane figures.
The numbers themselves are measured on purpose-sized batches in BENCHMARKS.md, never asserted here."""
import json
import math

import benchmark  # scripts/ is on pytest's pythonpath: a real import, as the memory probe pickles its worker by module name
from conftest import DEMO


def test_every_benchmark_runs_with_bf16_autocast_on_cpu(tmp_path):
    out = tmp_path / "results.jsonl"
    assert benchmark.main(["all", "--bf16", "--batch_size", "2", "--seq_len", "8", "--steps", "1", "--rounds", "1",
                           "--warmup", "1", "--threads", "1", "--data_dir", str(DEMO),
                           "--json", str(out)]) == 0
    results = {r["benchmark"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(results) == len(benchmark.BENCHMARKS)
    ratios = [r[key] for r in results.values() for key in r if "ratio" in key or "speedup" in key]
    assert len(ratios) == 8 and all(math.isfinite(x) and x > 0 for x in ratios)
    assert all(r["setup"]["autocast"] == "bf16" for r in results.values())
    pipeline = next(r for r in results.values() if "pipeline" in r["benchmark"])
    assert pipeline["real_tokens"] > 0 and pipeline["tokens_per_second"] > 0
    smart = next(r for r in results.values() if "SMART" in r["benchmark"])
    assert len(smart["smart_phase_s"]) == 5 and all(t > 0 for t in smart["smart_phase_s"].values())
    adapters = next(r for r in results.values() if "adapters" in r["benchmark"])
    full, lora = adapters["trainable_parameters"]["full fine-tuning"], adapters["trainable_parameters"]["lora"]
    assert 0 < lora < full and adapters["checkpoint_mib"]["lora"] < adapters["checkpoint_mib"]["full fine-tuning"]
