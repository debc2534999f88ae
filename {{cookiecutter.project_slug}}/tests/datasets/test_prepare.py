"""datasets/prepare.py: the command that writes data once, one subcommand per kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.datasets import prepare
from {{cookiecutter.package_name}}.datasets.prepare import kinds, main


def test_prepare_tokens_writes_the_folder_and_refuses_to_overwrite_it_in_one_line(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for number in range(3):
        (corpus / f"{number}.txt").write_text(f"file {number} " * 20)
    out = tmp_path / "tokens"
    assert main(["tokens", str(corpus), str(out), "--val-every", "3", "--repeat", "2"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["files"], meta["repeat"], meta["val_every"]) == (6, 2, 3)
    assert meta["val_tokens"] == 2 * len("file 0 " * 20), "files 0 and 3 of 0 1 2 0 1 2"
    assert f"train with data=tokens data.root={out}" in capsys.readouterr().out
    assert main(["tokens", str(corpus), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--force" in err and err.count("\n") == 1, err
    assert main(["tokens", str(corpus), str(out), "--force"]) == 0
    assert json.loads((out / "meta.json").read_text())["repeat"] == 1


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
    assert main(["tokens", "corpus", "out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: this project was made without any kind of data to prepare") and err.count("\n") == 1


def test_run_as_a_module_it_is_not_imported_by_its_package_first() -> None:
    # datasets/__init__.py imports only the modules that register data sets: were it to import prepare.py,
    # `python -m` would warn that the module was in sys.modules before it ran
    command = [sys.executable, "-m", "{{cookiecutter.package_name}}.datasets.prepare", "--help"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert all(name in proc.stdout for name in kinds())
