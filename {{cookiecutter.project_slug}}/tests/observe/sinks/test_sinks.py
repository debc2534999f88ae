"""observe/sinks/__init__.py: every module (or package) of the folder is a sink, built where the `log`
section switches it on and checked before a launch where it has a check (each sink's own tests: the
test files beside this one)."""

from __future__ import annotations

import types
from pathlib import Path

from {{cookiecutter.package_name}}.observe import sinks


def test_every_module_and_package_of_the_folder_is_a_sink_with_a_build() -> None:
    folder = Path(sinks.__file__).parent
    on_disk = {path.stem for path in folder.glob("*.py") if path.name != "__init__.py"}
    on_disk |= {path.name for path in folder.iterdir() if (path / "__init__.py").is_file()}
    found = sinks.sink_modules()
    assert sorted(module.__name__.rpartition(".")[2] for module in found) == sorted(on_disk)
    assert all(callable(module.build) for module in found)


def test_the_sinks_switched_on_are_built_and_checked_and_those_off_left_out(monkeypatch, tmp_path: Path) -> None:
    checked = []
    on, off = types.ModuleType("on"), types.ModuleType("off")
    on.build = lambda log, run_dir, env: ("built", log, run_dir, env)
    on.check = checked.append
    off.build = lambda log, run_dir, env: None  # switched off by its `log` key; and no check of its own
    monkeypatch.setattr(sinks, "sink_modules", lambda: [on, off])
    assert sinks.build_sinks("log", tmp_path, "env") == [("built", "log", tmp_path, "env")]
    sinks.check_sinks("log")
    assert checked == ["log"]
