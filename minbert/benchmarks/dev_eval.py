"""`dev_eval`: what a run's dev scoring after each stage costs, every dev example against --max_eval_examples."""
from __future__ import annotations

import statistics
import time

from minbert.benchmarks.models import build_minbert, build_tokenizer, synchronize
from minbert.benchmarks.settings import BenchmarkSettings
from minbert.tasks import MULTITASK

DEV_SUBSET = 2000  # dev_eval's --max_eval_examples: the subset it times beside the full dev sets


def bench_dev_eval(settings: BenchmarkSettings, device) -> dict:
    """A run's dev scoring after a stage (trainer.Trainer.score_dev): an untrained MultitaskBERT of --config (SBERT
    pairs) scoring the dev sets of --data_dir through the run's Evaluator, tokenised once beforehand as a run's cache
    holds them, in batches of --batch_size (a run's --eval_batch_size) at --precision; every dev example against
    --max_eval_examples DEV_SUBSET, alternating for --rounds rounds (median seconds)."""
    from minbert.data.batches import TokenizedSplits, load_task_data, standard_paths, subsample
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.prediction.inference import PredictionSettings, Predictor
    from minbert.prediction.run_evaluation import Evaluator
    model = MultitaskBERT(build_minbert(settings)).to(device).eval()
    data = load_task_data(standard_paths(settings.data_dir), MULTITASK, set())
    splits = TokenizedSplits(build_tokenizer(settings), model, settings.seq_len, {})
    predictor = Predictor(model, splits, device,
                          PredictionSettings(settings.batch_size, settings.seq_len, settings.precision, True))
    evaluator = Evaluator(predictor, data, seed=0)
    for limit in (None, DEV_SUBSET):  # the tokenisation a run does once, before its first stage
        for task, task_data in data.items():
            splits.get(task, subsample(task_data.dev, limit, 0))
    seconds = {"all": [], f"max_eval_examples {DEV_SUBSET}": []}
    for _ in range(settings.rounds):
        for name, limit in zip(seconds, (None, DEV_SUBSET)):
            synchronize(device)
            start = time.perf_counter()
            evaluator.evaluate("dev", limit)
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return {"benchmark": f"a run's dev scoring after a stage: the {sum(len(d.dev) for d in data.values())} dev "
                         f"examples of {settings.data_dir}, all of them vs a fixed subset of at most {DEV_SUBSET} "
                         "per task",
            "dev_examples": {task: len(d.dev) for task, d in data.items()},
            "median_s": {name: statistics.median(values) for name, values in seconds.items()},
            "seconds": seconds}
