"""The parser every command line builds: a bad flag is one line naming it, never argparse's usage block."""
import argparse


class OneLineErrorParser(argparse.ArgumentParser):
    """Reports a bad flag as one line 'PROG: error: ... (see --help)' and exit code 2, without the usage block.
    Its subcommands' parsers are of this class too (argparse makes them with the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
