"""Data written once, read by every run: one subcommand per kind of data.

`python -m <package>.datasets.prepare KIND ...`, or the console script `<package>-prepare KIND ...`
once installed; `prepare --help` lists the kinds this project has.

Each kind is a module of this folder, found by what is present, with `PREPARE_HELP` (its one line) and
`add_prepare_arguments(parser)`, which adds its arguments and sets `prepare`, the function that does the
work and returns the exit code (a ConfigError it raises: one line, exit code 2).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from ..common.errors import USER_ERROR_EXIT, ConfigError, say
from ..common.registry import modules_with


def kinds() -> dict[str, ModuleType]:
    """The kinds this project has, by name: the modules of this folder with `add_prepare_arguments`."""
    modules = modules_with(__package__, importlib.import_module(__package__).__path__, "add_prepare_arguments")
    return {module.__name__.rsplit(".", 1)[1]: module for module in modules
            if hasattr(module, "add_prepare_arguments")}  # fmt: skip  # not this module, which names it


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `KIND [arguments]` and run that kind's preparation; its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    found = kinds()
    if not found:
        say("error: this project was made without any kind of data to prepare: its data sets read their files "
            "as they are", err=True)  # fmt: skip
        return USER_ERROR_EXIT
    parser = argparse.ArgumentParser(prog="prepare", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    for name, module in sorted(found.items()):
        subparser = subparsers.add_parser(name, help=module.PREPARE_HELP, description=module.PREPARE_HELP)
        module.add_prepare_arguments(subparser)
    args = parser.parse_args(argv)
    try:
        return args.prepare(args)
    except ConfigError as error:
        say(f"error: {error}", err=True)
        return USER_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
