"""torchrun's agent as the launcher starts it: `python -m {{ cookiecutter.package_name }}.agent [torchrun's arguments]`.

The same agent as `python -m torch.distributed.run` (torchrun), quieter on the console where torchrun
would print its own traceback over what the workers already said:
- a signal the launcher forwarded (SIGTERM, SIGINT, SIGHUP) ends it with 128 + the signal, no traceback;
- failed workers are summarised as torchrun does (rank, exit code, their traceback), exit code 1.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, get_error_handler
from torch.distributed.run import parse_args, run


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except SignalException as stop:
        return 128 + int(stop.sigval)
    except ChildFailedError as failed:  # what torchrun's @record does, less the agent's own traceback
        _, failure = failed.get_first_failure()
        if failure.error_file != "<N/A>":
            get_error_handler().dump_error_file(failure.error_file, failure.exitcode)
        print(failed.format_msg(), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
