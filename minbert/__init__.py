"""minBERT multitask: everything that is not one of the course's own files, in folders that name the layers.

The course's files stay at the top of the repository where the handout puts them (bert.py, optimizer.py, smart.py,
simcse.py, tokenizer.py, evaluation.py, multitask_classifier.py, ...); this package holds the rest, each layer
importing only the layers listed before it (tests/test_module_boundaries.py holds the rules). It builds on the
course's building blocks (bert.py, base_bert.py, optimizer.py, smart.py, tokenizer.py), which import nothing from
it, and never imports the course's other files: evaluation.py, simcse.py and datasets.py name code that lives here.

    runtime.py, distributed.py, files.py, step_log.py, arguments.py
                 the device, precision and seeds; torchrun's data parallel; checked file IO; step logs; the
                 command lines' parser, whose errors are one line
    tasks/       one module per task (what differs between tasks: files, head, objective, metrics, outputs), the
                 objectives' building blocks (losses.py) and SQuAD's files, windows and decoding (squad.py)
    data/        the tasks' files batched (batches.py), NLI pairs for SimCSE, the scores files runs save, the
                 synthetic demo data (demo.py)
    model/       MultitaskBERT (its heads are the tasks'), adapters (LoRA, DoRA, PALs), checkpoints
    prediction/  predicting and evaluating a model, the leaderboard's scores and CSVs, ensembles of runs' saved scores
    reports/     a run's figures (forgetting matrix, curves, error plots, t-SNE) and the tables behind them
    robustness/  a model on seeded noisy dev sets and under attack (embedding-space PGD, greedy word substitution)
    training/    the step loop (StepLoop) and the run of stages around it (Trainer), schedules, SMART's anchor, EWC,
                 L2-SP, LNSR, surgery, distillation, MLM, SimCSE, the run's progress saved for resuming
    run/         a run from its flags: the flag schema (training_args.py), assembling a run (run_setup.py), args.json,
                 a trained run in Python (trained_run.py: load_run, below)
    sweeps/      Optuna sweeps of runs (scripts/sweep.py): the space, the study and its storage, trials, summary
    benchmarks/  the harness behind scripts/benchmark.py: step timings against transformers, memory, throughput,
                 the host syncs and graph breaks of a training step, the SQuAD 2.0 peer run

`pip install -e .` makes it importable from anywhere, scripts/ included. The package's one name is a trained run's
Python API, `from minbert import load_run` (docs/python_api.md); it is imported on first use, so that `import minbert`
stays light (no torch) and the package's front door does not tie its lowest layer to its highest.
"""

__all__ = ["load_run"]


def __getattr__(name: str):
    if name == "load_run":
        from minbert.run.trained_run import load_run
        return load_run
    raise AttributeError(f"module 'minbert' has no attribute {name!r}")
