"""The parser every command line builds: a bad flag is one line naming it, never argparse's usage block."""
import argparse
import copy


class OneLineErrorParser(argparse.ArgumentParser):
    """Reports a bad flag as one line 'PROG: error: ... (see --help)' and exit code 2, without the usage block.
    Its subcommands' parsers are of this class too (argparse makes them with the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def flags_given(parser: argparse.ArgumentParser, argv) -> set[str]:
    """The destinations of the flags the command line gives (abbreviated too), whatever their values: what a
    --config does not decide, and what a command refuses where it would do nothing."""
    given_only = copy.deepcopy(parser)
    for action in given_only._actions:
        action.default = argparse.SUPPRESS
    return set(vars(given_only.parse_args(argv)))


def rng_seed(text: str) -> int:
    """argparse's type of a --seed: an integer numpy's and torch's generators both take, [0, 2**32)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**32), got {value}")
    return value
