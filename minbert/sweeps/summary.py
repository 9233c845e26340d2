"""The study's results: summary.md (a row per trial, the best one and the command lines that rerun it) and Optuna's
figures beside it."""
from __future__ import annotations

import warnings
from pathlib import Path

from minbert.files import atomic_write_text
from minbert.sweeps.runs import command_line, run_folders
from minbert.sweeps.settings import Sweep
from minbert.sweeps.space import flag_actions, flag_tokens
from minbert.sweeps.trials import is_continuation

PLOTS = {"history.png": "plot_optimization_history", "importances.png": "plot_param_importances",
         "parallel_coordinates.png": "plot_parallel_coordinate"}


def trial_row(frozen, best_number: int | None) -> str:
    state = frozen.state.name.lower()
    note = frozen.user_attrs.get("note", "")
    if state == "fail" and "note" not in frozen.user_attrs:
        state, note = "interrupted", "continued by a later trial"
    elif is_continuation(frozen) and not note:
        note = f"continues trial {frozen.system_attrs['failed_trial']}"
    value = "" if frozen.value is None else f"{frozen.value:.4f}"
    params = ", ".join(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
                       for name, value in frozen.params.items())
    marker = " (best)" if frozen.number == best_number else ""
    return (f"| {frozen.number}{marker} | {state} | {value} | {params} | {frozen.user_attrs.get('folder', '')} | "
            f"{note.replace('|', '/')} |")


def best_trial(study):
    import optuna
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return study.best_trial if complete else None


def summary(study, sweep: Sweep) -> str:
    """Markdown: a row per trial (not the surplus ones), the best trial and the command lines that rerun it."""
    best = best_trial(study)
    lines = [f"# Sweep {sweep.study}: {sweep.objective} ({sweep.direction}), "
             f"mean over {len(sweep.seeds)} seed(s)", "",
             "| trial | state | value | parameters | folder | note |", "|---|---|---|---|---|---|"]
    lines += [trial_row(t, best.number if best else None) for t in study.get_trials(deepcopy=False)
              if not t.user_attrs.get("surplus")]
    if best is None:
        return "\n".join(lines + ["", "No trial has completed yet."]) + "\n"
    run = run_folders(sweep.folder / best.user_attrs["folder"], sweep.seeds)[0]
    values = best.user_attrs.get("values", best.params)
    flags = [word for name, value in values.items() for word in flag_tokens(name, value, flag_actions())]
    lines += ["", f"Best: trial {best.number}, {sweep.objective} {best.value:.4f}, in {run}.", "",
              "Its run again, from its own record:", "",
              f"    python multitask_classifier.py --config {command_line([str(run / 'args.json')])} "
              "--output_dir runs/best", "",
              "Its settings as flags:", "",
              f"    python multitask_classifier.py {command_line([*sweep.base, *flags])} --seed {sweep.seeds[0]}"]
    return "\n".join(lines) + "\n"


def write_plots(study, folder: Path) -> list[str]:
    """Optuna's figures of the study as PNG files in its folder; notes for those it cannot draw yet."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as figures
    notes = []
    for name, function in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = getattr(figures, function)(study)
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            figure.savefig(folder / name, dpi=100, bbox_inches="tight")
            plt.close(figure)
        except (ValueError, RuntimeError, ZeroDivisionError, ImportError) as err:  # too few trials yet
            notes.append(f"note: no {name} yet ({err})")
    return notes


def report(study, sweep: Sweep) -> None:
    sweep.folder.mkdir(parents=True, exist_ok=True)
    text = summary(study, sweep)
    atomic_write_text(sweep.folder / "summary.md", text)
    print(text)
    for note in write_plots(study, sweep.folder):
        print(note)
    print(f"wrote {sweep.folder / 'summary.md'} and the plots beside it")
