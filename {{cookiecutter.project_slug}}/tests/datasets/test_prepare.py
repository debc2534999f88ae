"""datasets/prepare.py: the command that writes data once, one subcommand per kind (each kind's own
preparation: its module's test file)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from {{cookiecutter.package_name}}.datasets import prepare
from {{cookiecutter.package_name}}.datasets.prepare import kinds, main


def test_every_kind_has_its_help_and_a_kind_is_required(capsys) -> None:
    found = kinds()
    assert found, "the kinds are the modules of datasets/ with add_prepare_arguments"
    for name, module in found.items():
        with pytest.raises(SystemExit) as shown:
            main([name, "--help"])
        assert shown.value.code == 0
        assert module.PREPARE_HELP in capsys.readouterr().out
    with pytest.raises(SystemExit) as listed:
        main(["--help"])
    listing = capsys.readouterr().out
    assert listed.value.code == 0 and all(name in listing for name in found)
    with pytest.raises(SystemExit) as refused:
        main([])
    assert refused.value.code == 2 and "KIND" in capsys.readouterr().err


def test_a_project_without_a_kind_to_prepare_says_so_in_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(prepare, "kinds", dict)  # a bake made without every kind
    assert main(["anything", "SOURCE", "OUT"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: this project was made without any kind of data to prepare") and err.count("\n") == 1


def test_run_as_a_module_it_is_not_imported_by_its_package_first() -> None:
    # datasets/__init__.py imports only the modules that register data sets: were it to import prepare.py,
    # `python -m` would warn that the module was in sys.modules before it ran
    command = [sys.executable, "-m", "{{cookiecutter.package_name}}.datasets.prepare", "--help"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert all(name in proc.stdout for name in kinds())
