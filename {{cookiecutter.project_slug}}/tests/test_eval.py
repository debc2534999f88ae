"""eval.py in the package: a checkpoint evaluated exactly, in this process; its mistakes in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from {{cookiecutter.package_name}} import eval as entry
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly import entry as entry_module
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.tasks import ClassificationWithAux

from .helpers import compose_config, cpu_env

AUX_TASK = f"{ClassificationWithAux.__module__}.{ClassificationWithAux.__name__}"

# @record wants a real stderr for faulthandler; under capsys it has none, which changes nothing here.
pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")

TINY = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=48", "data.val_size=16",
        "data.batch_size=16", "data.image_size=8", "trainer.epochs=1"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """A tiny training's checkpoint and the figures of its last validation."""
    run_dir = tmp_path_factory.mktemp("run")
    result = build_trainer(to_train_config(compose_config(TINY)), cpu_env(0, 1), run_dir).fit()
    return run_dir / "checkpoints" / "step_00000003.pt", result.line()


def evaluate(monkeypatch, capsys, *args: str) -> str:
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["eval.py", *args])
    entry.main()
    return capsys.readouterr().out


@pytest.mark.parametrize("legacy", [[], ["--local-rank=0"], ["--local_rank", "0"]])
def test_a_checkpoint_evaluates_to_the_figures_of_the_trainers_last_validation(
    in_process, trained, monkeypatch, capsys, legacy: list[str]
) -> None:
    checkpoint, figures = trained
    out = evaluate(monkeypatch, capsys, f"ckpt_path={checkpoint}", *legacy)
    assert out == figures + "\n" and figures.endswith(" val_samples=16")
    assert in_process == [0]


def figures_of(line: str) -> dict[str, float]:
    return {name: float(value) for name, value in (item.split("=") for item in line.split())}


def test_another_batch_size_given_evaluates_to_the_same_figures(in_process, trained, monkeypatch, capsys) -> None:
    checkpoint, figures = trained
    batch_sizes = []
    real_build_data = entry_module.build_data

    def build_data(config, env, seed):  # noqa: ANN001, ANN202
        batch_sizes.append(config.batch_size)
        return real_build_data(config, env, seed)

    monkeypatch.setattr(entry_module, "build_data", build_data)
    out = evaluate(monkeypatch, capsys, f"ckpt_path={checkpoint}", "data.batch_size=5")
    assert batch_sizes == [5], "the batch size given wins over the checkpoint's 16"
    got, expected = figures_of(out), figures_of(figures)
    assert got.keys() == expected.keys() and got["val_samples"] == 16 and got["val_acc"] == expected["val_acc"]
    # A sample's float32 loss may differ in its last bits in a batch of another size.
    assert got["val_loss"] == pytest.approx(expected["val_loss"], abs=2e-6)


def test_a_data_setting_given_wins_over_the_checkpoints(in_process, trained, monkeypatch, capsys) -> None:
    checkpoint, _ = trained
    out = evaluate(monkeypatch, capsys, f"ckpt_path={checkpoint}", "data.val_size=5")
    assert out.endswith(" val_samples=5\n"), out


@pytest.mark.parametrize(
    ("kind", "reason"), [("missing", "no such file"), ("notes", "not a checkpoint of this project")]
)
def test_a_path_that_is_not_a_checkpoint_is_refused_in_one_line(
    in_process, monkeypatch, capsys, tmp_path: Path, kind: str, reason: str
) -> None:
    path = tmp_path / "step_00000003.pt"
    if kind == "notes":
        path.write_text("notes")
    with pytest.raises(SystemExit) as stopped:
        evaluate(monkeypatch, capsys, f"ckpt_path={path}")
    assert stopped.value.code == 2 and in_process == []
    err = capsys.readouterr().err
    assert err.startswith("error: ckpt_path") and str(path) in err and err.count("\n") == 1, err
    assert reason in err and "give a checkpoints/step_<N>.pt" in err


def test_a_task_the_checkpoints_model_cannot_take_is_refused_in_one_line(
    in_process, trained, monkeypatch, capsys
) -> None:
    checkpoint, _ = trained
    with pytest.raises(SystemExit) as stopped:
        # a task for a model that returns (logits, aux): the checkpoint's classifier returns logits alone
        evaluate(monkeypatch, capsys, f"ckpt_path={checkpoint}", f"task._target_={AUX_TASK}")
    assert stopped.value.code == 2 and in_process == []
    err = capsys.readouterr().err
    assert err.startswith("error: model, data and task do not fit together: one batch fails with "), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_ckpt_path_best_evaluates_the_best_checkpoint_and_its_ema(in_process, tmp_path, monkeypatch, capsys) -> None:
    """checkpoint.keep_best's best, by `<run dir>/checkpoints/best` and by a bare `best` (the newest run
    under outputs/), scored as the run's validation scored it: with the EMA of the weights."""
    import json

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "outputs" / "run"
    overrides = [*TINY, "trainer.epochs=3", "checkpoint.keep_best=1", "checkpoint.monitor=val_acc",
                 "checkpoint.mode=max", "trainer.ema.decay=0.5"]  # fmt: skip
    build_trainer(to_train_config(compose_config(overrides)), cpu_env(0, 1), run_dir).fit()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best = max((record for record in records if record["kind"] == "val"), key=lambda record: record["val_acc"])
    for given in (run_dir / "checkpoints" / "best", Path("best")):
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={given}"])
        entry.main()
        said = capsys.readouterr()
        figures = figures_of(said.out)
        assert figures["val_acc"] == best["val_acc"]
        assert figures["val_loss"] == pytest.approx(best["val_loss"], abs=1e-6)
        assert f"step_{best['step']:08d}.pt (step {best['step']})" in said.out + said.err
        assert "evaluating the EMA of the weights (trainer.ema)" in said.out + said.err


def test_a_folder_of_shards_where_the_project_cannot_read_them_is_refused_in_one_line_saying_how(
    in_process, monkeypatch, capsys, tmp_path: Path
) -> None:
    """Not its saved config's `strategy=` refused: the folder itself, with the way to one file."""
    import importlib.util

    found = importlib.util.find_spec  # a project made without the strategies that write them: no sharded.py
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name.endswith(".sharded") else found(name))
    folder = tmp_path / "step_00000003"
    folder.mkdir()
    with pytest.raises(SystemExit) as stopped:
        evaluate(monkeypatch, capsys, f"ckpt_path={folder}")
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and in_process == [] and err.count("\n") == 1, err
    assert err.startswith(f"error: {folder} is a folder of shards, and this project was made without the strategies")


def test_a_url_is_refused_in_one_line_by_eval_and_the_export(in_process, monkeypatch, capsys, tmp_path) -> None:
    from {{cookiecutter.package_name}}.export import main as export_main

    url = "https://host/run/checkpoints/step_00000003.pt"
    said = "a checkpoint is read from this machine's disk, not from a URL: copy it down first"
    with pytest.raises(SystemExit) as stopped:
        evaluate(monkeypatch, capsys, f"ckpt_path={url}")
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith(f"error: ckpt_path={url}: {said}"), err
    with pytest.raises(SystemExit) as stopped:
        export_main([url, str(tmp_path / "out.pt")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith(f"error: CHECKPOINT={url}: {said}"), err
    assert err.count("\n") == 1 and err.rstrip().endswith(" and give the local path"), err
