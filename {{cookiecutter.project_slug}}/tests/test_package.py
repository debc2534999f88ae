"""The package itself: what a user's own model, data set or task may import from it, loaded on first use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import {{cookiecutter.package_name}} as package
from {{cookiecutter.package_name}} import datasets, tasks
from {{cookiecutter.package_name}}.datasets import randomness

PROJECT_DIR = Path(__file__).resolve().parents[1]


def test_each_exported_name_is_the_real_object() -> None:
    assert package.Task is tasks.Task
    assert package.seeded_by_sample is randomness.seeded_by_sample
    assert package.sample_generator is randomness.sample_generator
    assert package.current_sample is randomness.current_sample
    assert package.TensorImages is datasets.TensorImages
    assert package.normalise is datasets.normalise
    from {{cookiecutter.package_name}} import Task, TensorImages  # the form the README shows

    assert (Task, TensorImages) == (tasks.Task, datasets.TensorImages)


def test_all_names_exactly_the_exports() -> None:
    expected = ["Task", "TensorImages", "current_sample", "gather_with_grad", "normalise", "sample_generator",
                "seeded_by_sample"]  # fmt: skip
    assert package.__all__ == expected


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module '{{cookiecutter.package_name}}' has no attribute 'Trainer'"):
        package.Trainer  # noqa: B018
    assert not hasattr(package, "models_and_more")
    with pytest.raises(ImportError):
        from {{cookiecutter.package_name}} import Trainer  # noqa: F401


def test_importing_the_package_alone_imports_no_torch() -> None:
    code = (
        "import json, sys; import {{cookiecutter.package_name}}; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], "the launcher's start-up pays for no torch"


def unsafe_loads(source: str) -> list[str]:
    """Each torch.load call of `source` without an explicit weights_only=True, and each pickle.load/loads:
    what could run code from a file."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        if owner == "torch" and node.func.attr == "load":
            safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords)
            if not safe:
                found.append(f"line {node.lineno}: torch.load without weights_only=True")
        elif owner == "pickle" and node.func.attr in ("load", "loads"):
            found.append(f"line {node.lineno}: pickle.{node.func.attr}")
    return found


def test_every_load_in_the_package_is_weights_only_and_nothing_is_unpickled() -> None:
    """Every module, in every folder (the checkpoint and data set code is where the loads are)."""
    modules = sorted((PROJECT_DIR / "{{cookiecutter.package_name}}").rglob("*.py"))
    assert any("checkpoint" in path.parts for path in modules) and len(modules) > 40
    unsafe = {str(path.relative_to(PROJECT_DIR)): unsafe_loads(path.read_text()) for path in modules}
    assert {path: lines for path, lines in unsafe.items() if lines} == {}
    assert unsafe_loads("torch.load(f, weights_only=False)\ntorch.load(f)\npickle.loads(b)") == [
        "line 1: torch.load without weights_only=True", "line 2: torch.load without weights_only=True",
        "line 3: pickle.loads"]  # fmt: skip
