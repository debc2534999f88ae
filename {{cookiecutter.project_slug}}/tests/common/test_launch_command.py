"""common/launch_command.py: the launcher's command reaches the workers under its name (common/run_dir.py's
launch_environment finds it), and the run's record reads it back, redacted (observe/provenance.py)."""

from __future__ import annotations

from {{cookiecutter.package_name}}.common.launch_command import LAUNCH_COMMAND_ENV
from {{cookiecutter.package_name}}.common.run_dir import launch_environment
from {{cookiecutter.package_name}}.observe.provenance import command


def test_the_launchers_command_reaches_the_workers_and_the_runs_record_redacted() -> None:
    environ = launch_environment("single", ["NPROC_PER_NODE=2", "data.url=https://k:pw888@b"])
    assert list(environ) == [LAUNCH_COMMAND_ENV]
    assert command(["train.py"], environ)["launcher"] == ["single", "NPROC_PER_NODE=2", "data.url=https://k:***@b"]
    assert command(["train.py"], {})["launcher"] is None, "a worker started without the launcher"
