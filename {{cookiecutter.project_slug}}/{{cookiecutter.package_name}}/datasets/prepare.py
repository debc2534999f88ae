"""Data written once, read by every run: one subcommand per kind of data (docs/data_at_scale.md).

`python -m <package>.datasets.prepare KIND ...`, or the console script `<package>-prepare KIND ...`
once installed:

- `tokens CORPUS OUT`: a text corpus (a folder, a glob, or the standard library's sources) into token
  files that training memory-maps (tokens.py): no rank holds the corpus in memory.
- `shards SOURCE OUT --kind images|text`: an image folder or a text corpus into shards that training
  reads from a folder or an object store, through a node's local cache (shards.py).

Each kind is a module of this folder with `add_prepare_arguments(parser)`, which adds its arguments
and sets `prepare`, the function that does the work and returns the exit code (a ConfigError it
raises: one line, exit code 2); only the kind asked for is imported.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ..common.errors import USER_ERROR_EXIT, ConfigError, say

# (the command's name, its module in this folder, its one-line help)
KINDS = (
    ("tokens", "tokens", "a text corpus into memory-mapped token files"),
    ("shards", "shards", "an image folder or a text corpus into shards, to a folder or s3://"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `KIND [arguments]` and run that kind's preparation; its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="prepare", description=__doc__.splitlines()[0])
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)  # the kind: there are no other options
    for name, module, summary in KINDS:
        subparser = kinds.add_parser(name, help=summary, description=summary)
        if name == chosen:
            importlib.import_module(f".{module}", __package__).add_prepare_arguments(subparser)
    args = parser.parse_args(argv)
    try:
        return args.prepare(args)
    except ConfigError as error:
        say(f"error: {error}", err=True)
        return USER_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
