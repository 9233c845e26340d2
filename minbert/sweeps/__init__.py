"""Hyperparameter sweeps of multitask_classifier.py on Optuna (scripts/sweep.py, docs/sweeps.md), resumable, on one
machine or many. Optuna and SQLAlchemy are imported only when a sweep runs, so the package imports without them.

    settings.py  a sweep's settings (Sweep), a parameter of its space (Parameter), its one-line refusal (SweepError)
    space.py     the search space and --enqueue's configurations, read and checked against the run's own flags
    base_run.py  the base run's checks: flags the sweep sets, the objective, its data files
    runs.py      one seed's run of a trial in its own process, reported to the pruner, its kept model's score
    trials.py    a worker's trials: parameters, records in their folders, dead workers' trials continued
    study.py     the study and its storage: created or loaded and checked, forgotten when every trial failed
    summary.py   summary.md and Optuna's figures
"""
