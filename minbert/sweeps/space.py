"""The search space (space.json) and --enqueue's configurations, read and checked against multitask_classifier.py's
own flags before the first trial: each parameter a flag that the sweep does not set, each bound or choice one that a
run accepts on top of the base flags."""
from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import math
import tempfile
from pathlib import Path

from minbert.run.training_args import TrainingArguments, build_parser, parse_training_args
from minbert.sweeps.settings import SWEEP_FLAGS, Parameter, SweepError

KINDS = ("float", "int", "choices")
SPACE_KEYS = {*KINDS, "log", "step", "when"}


def read_json(flag: str, path: Path):
    """The JSON file a flag names; SweepError naming the flag and the file when it cannot be read or parsed, or when
    it names a key twice (JSON keeps the last silently: a parameter given twice would be searched once)."""
    def refuse_repeats(pairs: list) -> dict:
        names = [name for name, _ in pairs]
        repeated = next((name for name in names if names.count(name) > 1), None)
        if repeated is not None:
            raise SweepError(f"{flag} {path}: {repeated!r} is named twice")
        return dict(pairs)
    try:
        return json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=refuse_repeats)
    except OSError as err:
        raise SweepError(f"{flag} {path}: cannot read it ({err.strerror or err})") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise SweepError(f"{flag} {path}: not a JSON file ({err})") from None


def read_space(path: Path) -> tuple[Parameter, ...]:
    """The space file's parameters in its order; SweepError naming the file and the parameter."""
    content = read_json("--space", path)
    if not isinstance(content, dict) or not content:
        raise SweepError(f"--space {path}: expected a JSON object of parameters by flag name, e.g. "
                         '{"lr": {"float": [1e-5, 1e-3], "log": true}}')
    parameters: list[Parameter] = []
    for name, spec in content.items():
        parameters.append(parameter_from(f"--space {path}: {name!r}", name, spec, parameters))
    return tuple(parameters)


def parameter_from(where: str, name: str, spec, earlier: list[Parameter]) -> Parameter:
    if not isinstance(spec, dict) or not set(spec) <= SPACE_KEYS or len(set(spec) & set(KINDS)) != 1:
        raise SweepError(f"{where}: expected an object with one of {', '.join(map(repr, KINDS))} and optionally "
                         f"'log', 'step', 'when', found {json.dumps(spec)}")
    kind = next(key for key in KINDS if key in spec)
    when = conditions(where, spec.get("when", {}), earlier)
    if kind == "choices":
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices or set(spec) - {"choices", "when"}:
            raise SweepError(f"{where}: 'choices' must be a non-empty list (without 'log' or 'step')")
        return Parameter(name, kind, choices=tuple(choices), when=when)
    bounds, log, step = spec[kind], spec.get("log", False), spec.get("step")
    number = int if kind == "int" else (int, float)
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(_is(b, number) for b in bounds)
            and bounds[0] < bounds[1]):
        raise SweepError(f"{where}: {kind!r} must be [low, high] with low < high, {kind} numbers, found "
                         f"{json.dumps(bounds)}")
    if not isinstance(log, bool) or (log and bounds[0] <= 0) or (step is not None and (
            log or not _is(step, number) or step <= 0)):
        raise SweepError(f"{where}: 'log' needs low > 0 and no 'step'; 'step' must be a positive {kind}")
    if step is not None and not divides(step, bounds[1] - bounds[0]):
        # Optuna would move the high end onto the grid without a word, searching a range the space does not name.
        raise SweepError(f"{where}: 'step' {step} does not divide the range {json.dumps(bounds)}: make high - low "
                         "a whole number of steps")
    return Parameter(name, kind, bounds[0], bounds[1], log, step, when=when)


def divides(step: float | int, width: float | int) -> bool:
    """Whether `width` is a whole number of `step`s, up to the rounding of decimal steps in binary (0.3 / 0.05)."""
    steps = width / step
    return math.isclose(steps, round(steps), rel_tol=1e-9)


def _is(value, types) -> bool:
    return isinstance(value, types) and not isinstance(value, bool) and math.isfinite(value)


def conditions(where: str, when, earlier: list[Parameter]) -> tuple[tuple[str, tuple], ...]:
    """A parameter's 'when': {earlier parameter: value or list of values}."""
    names = {p.name: p for p in earlier}
    if not isinstance(when, dict):
        raise SweepError(f"{where}: 'when' must be an object {{earlier parameter: value or [values]}}")
    result = []
    for name, values in when.items():
        if name not in names:
            raise SweepError(f"{where}: 'when' names {name!r}, which is not a parameter above it in the space")
        result.append((name, tuple(values) if isinstance(values, list) else (values,)))
    return tuple(result)


def flag_tokens(name: str, value, actions: dict) -> list[str]:
    """The command-line words that set flag `name` to `value`: a switch is given or left out (--no-NAME where
    the flag has one), a list is several words."""
    action = actions[name]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [f"--{name}" if value else f"--no-{name}"]
    if action.nargs == 0:  # store_true: false is the flag left out (check_space refuses a base that gives it)
        return [f"--{name}"] if value else []
    words = value if isinstance(value, list) else [value]
    return [f"--{name}", *(json.dumps(w) if isinstance(w, bool) else str(w) for w in words)]


def flag_actions() -> dict:
    """multitask_classifier.py's flags by name (destination), with their argparse actions."""
    parser = build_parser(TrainingArguments)
    return {action.dest: action for action in parser._actions if action.option_strings}


def parse_run(argv: list[str], where: str) -> TrainingArguments:
    """multitask_classifier.py's settings from `argv`, checked as it checks them; SweepError with its one line."""
    stderr, stdout = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            return parse_training_args(argv, None)
    except SystemExit:
        problem = stderr.getvalue().strip().splitlines()
        message = problem[-1].split("error: ", 1)[-1] if problem else "refused"
        raise SweepError(f"{where}: {message}") from None


def check_space(space: tuple[Parameter, ...], base: list[str], space_path: Path, seeds: int) -> None:
    """Every parameter is a flag the sweep does not set itself, and each of its bounds or choices is accepted by
    multitask_classifier.py on top of the base flags: refused now, not in the middle of the sweep."""
    actions = flag_actions()
    scratch = ["--output_dir", tempfile.gettempdir()]
    base_args = parse_run(base + scratch, "the base flags after --")
    for parameter in space:
        where = f"--space {space_path}: {parameter.name!r}"
        set_by_sweep = parameter.name in SWEEP_FLAGS or (parameter.name == "seed" and seeds > 1)
        if parameter.name not in actions or set_by_sweep:
            close = difflib.get_close_matches(parameter.name, actions, 1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            reason = ("is set by the sweep itself" if parameter.name in actions
                      else f"is not a flag of multitask_classifier.py{suggestion}")
            raise SweepError(f"{where} {reason}")
        action = actions[parameter.name]
        if action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction) \
                and getattr(base_args, parameter.name) and False in parameter.choices:
            raise SweepError(f"{where}: the base flags turn --{parameter.name} on, so the choice false cannot turn "
                             "it off; leave it out of the base flags")
        # Checked where a trial sets it: with its 'when' (a --smart_* flag with --smart; alone it would do nothing).
        under = [word for name, values in parameter.when for word in flag_tokens(name, values[0], actions)]
        for value in parameter.values_to_check():
            parse_run(base + under + flag_tokens(parameter.name, value, actions) + scratch,
                      f"{where} = {json.dumps(value)}")


def read_enqueued(path: Path, space: tuple[Parameter, ...], base: list[str]) -> tuple[dict, ...]:
    """--enqueue's configurations (a JSON object of the space's parameters, or a list of them), each a point of the
    space that multitask_classifier.py accepts: SweepError naming the file and the parameter otherwise."""
    content = read_json("--enqueue", path)
    configurations = content if isinstance(content, list) else [content]
    if not configurations or not all(isinstance(c, dict) for c in configurations):
        raise SweepError(f"--enqueue {path}: expected a JSON object of the space's parameters, or a list of them")
    actions, names = flag_actions(), [p.name for p in space]
    for configuration in configurations:
        unknown = [name for name in configuration if name not in names]
        if unknown:
            raise SweepError(f"--enqueue {path}: {unknown[0]!r} is not a parameter of the space")
        words = []
        for p in space:
            where = f"--enqueue {path}: {p.name!r}"
            searched = p.searched_under(configuration)
            if p.name not in configuration:
                if searched:
                    raise SweepError(f"{where} is missing (a queued configuration gives every parameter it searches)")
                continue
            value = configuration[p.name]
            if not searched:
                raise SweepError(f"{where} is given but its 'when' does not hold, so a trial would not search it")
            inside = value in p.choices if p.kind == "choices" else (
                _is(value, int if p.kind == "int" else (int, float)) and p.low <= value <= p.high)
            if not inside:
                raise SweepError(f"{where} = {json.dumps(value)} is outside the space")
            words += flag_tokens(p.name, value, actions)
        parse_run(base + words + ["--output_dir", tempfile.gettempdir()], f"--enqueue {path}")
    return tuple(configurations)
