"""engine/checkpoint/trust.py: a checkpoint from elsewhere runs no code. Doctored copies of real checkpoints
(a whole .pt, a folder of shards) name code outside the project; eval.py, the export and model.init_from
refuse each in one line before anything is imported or built, and run it only with the user's opt-in."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}} import eval as eval_entry
from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.assembly.init_weights import read_weights
from {{cookiecutter.package_name}}.engine.checkpoint.trust import check_trusted, trusted
from {{cookiecutter.package_name}}.export import main as export_main

from ...helpers import compose_config, cpu_env, on_ranks

pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")

TINY = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=16", "data.val_size=8",
        "data.batch_size=8", "data.image_size=8", "trainer.max_steps=1"]  # fmt: skip
# A module shipped beside a checkpoint: importing it is running it.
PAYLOAD = """
from pathlib import Path
Path(__file__).with_name("ran").write_text("imported")
from {{ cookiecutter.package_name }}.models import SmallCNN
class Payload(SmallCNN):
    pass
"""


def fsdp_checkpoint(env, run_dir: Path) -> None:  # noqa: ANN001
    build_trainer(to_train_config(compose_config([*TINY, "strategy=fsdp"])), env, run_dir).fit()


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> dict[str, Path]:
    """A whole .pt (ddp) and a folder of shards (fsdp, one rank) of one tiny training each."""
    root = tmp_path_factory.mktemp("genuine")
    build_trainer(to_train_config(compose_config(TINY)), cpu_env(0, 1), root / "ddp").fit()
    on_ranks(1, fsdp_checkpoint, root / "fsdp")
    return {"ddp": root / "ddp" / "checkpoints" / "step_00000001.pt",
            "fsdp": root / "fsdp" / "checkpoints" / "step_00000001"}  # fmt: skip


def doctored(genuine: dict[str, Path], kind: str, tmp_path: Path, key: str, target: str) -> Path:
    """A copy of a genuine checkpoint whose saved config names `target` at `key`, with PAYLOAD beside it
    on Python's path (as a folder shipped with a download is when one runs from it)."""
    source = genuine[kind]
    copy = tmp_path / "shared" / source.name
    if kind == "fsdp":
        import shutil

        shutil.copytree(source, copy)
        trainer_file = copy / "trainer.pt"
    else:
        copy.parent.mkdir()
        trainer_file = copy
    payload = torch.load(source / "trainer.pt" if kind == "fsdp" else source, weights_only=True)
    node = payload["config"]
    *path, last = key.split(".")
    for name in path:
        node = node[name]
    node[last] = target
    torch.save(payload, trainer_file)
    (tmp_path / "shared" / "payload_module.py").write_text(PAYLOAD)
    return copy


@pytest.fixture
def beside(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path / "shared"))
    yield tmp_path / "shared"
    sys.modules.pop("payload_module", None)


def refused_line(err: str, target: str, opt_in: str) -> None:
    assert err.count("\n") == 1 and err.startswith("error: the checkpoint's config names "), err
    assert f"._target_={target}, which no config of this project names" in err and err.rstrip().endswith(opt_in)


@pytest.mark.parametrize(
    ("kind", "key", "target"),
    [
        ("ddp", "model._target_", "payload_module.Payload"),  # a module shipped beside it
        ("fsdp", "model._target_", "payload_module.Payload"),
        ("ddp", "data.dataset._target_", "os.system"),  # nested, a function Hydra's blocklist names
        ("fsdp", "task._target_", "torch.nn.modules.module.os.system"),  # through torch's own modules
        ("ddp", "model._target_", "{{ cookiecutter.package_name }}.engine.checkpoint.files.write_atomically"),
    ],
)
def test_eval_and_the_export_refuse_a_doctored_checkpoint_in_one_line_before_anything_runs(
    genuine, tmp_path, beside, in_process, monkeypatch, capsys, kind: str, key: str, target: str
) -> None:
    path = doctored(genuine, kind, tmp_path, key, target)
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}"])
    with pytest.raises(SystemExit) as stopped:
        eval_entry.main()
    assert stopped.value.code == 2
    refused_line(capsys.readouterr().err, target, "trust_checkpoint=true")
    with pytest.raises(SystemExit) as stopped:
        export_main([str(path), str(tmp_path / "out.pt")])
    assert stopped.value.code == 2
    refused_line(capsys.readouterr().err, target, "--trust-checkpoint")
    assert not (beside / "ran").exists() and "payload_module" not in sys.modules, "nothing of it was imported"
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_model_init_from_refuses_a_doctored_run_and_reads_it_when_trusted(genuine, tmp_path, beside, kind: str) -> None:
    path = doctored(genuine, kind, tmp_path, "model._target_", "payload_module.Payload")
    with pytest.raises(ConfigError, match=r"names model._target_=payload_module.Payload, .*trust_checkpoint=true$"):
        read_weights(path)
    weights = read_weights(path, trust=True)  # weights only: trusting builds nothing from the config either
    assert "0.0.weight" in weights and not (beside / "ran").exists()


def test_trusted_the_doctored_model_is_built_and_evaluates(
    genuine, tmp_path, beside, in_process, monkeypatch, capsys
) -> None:
    path = doctored(genuine, "ddp", tmp_path, "model._target_", "payload_module.Payload")
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={genuine['ddp']}"])
    eval_entry.main()
    figures = capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}", "trust_checkpoint=true"])
    eval_entry.main()
    assert capsys.readouterr().out == figures and (beside / "ran").read_text() == "imported"
    export_main([str(path), str(tmp_path / "out.pt"), "--trust-checkpoint"])
    assert torch.load(tmp_path / "out.pt", weights_only=True).keys() == torch.load(path)["model"].keys()


def test_a_trust_saved_in_the_checkpoint_is_not_the_users(genuine, tmp_path, beside, in_process, monkeypatch) -> None:
    path = doctored(genuine, "ddp", tmp_path, "trust_checkpoint", True)  # type: ignore[arg-type]
    payload = torch.load(path, weights_only=True)
    payload["config"]["model"]["_target_"] = "payload_module.Payload"
    torch.save(payload, path)
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}"])
    with pytest.raises(SystemExit):
        eval_entry.main()
    assert not (beside / "ran").exists()


def test_what_the_projects_configs_could_name_is_trusted_and_nothing_else() -> None:
    package = "{{ cookiecutter.package_name }}"
    for target in ("torch.nn.Linear", "torch.optim.AdamW", "torch.optim.lr_scheduler.StepLR",
                   "torchvision.models.resnet18", "torchvision.models.resnet.resnet50", f"{package}.models.GPT",
                   f"{package}.engine.schedule.Cosine", f"{package}.datasets.synthetic_images"):  # fmt: skip
        assert trusted(target), target
    for target in ("os.system", "builtins.exec", "torch.nn.functional.relu", "torchvision.models.get_model",
                   "torch.hub.load", f"{package}.models.os.system", f"{package}.launch.main.main",
                   f"{package}.engine.checkpoint.files.write_atomically", "torch.optim.Optimizer.step"):  # fmt: skip
        assert not trusted(target), target
    # The user's side of the package, named by no config file (a model of their own in models.py): trusted
    # where it is defined; the machinery is not, though defined in the package.
    for target in (f"{package}.models.MixtureOfExperts", f"{package}.datasets.images.TensorImages"):
        assert trusted(target), target
    for target in (f"{package}.engine.checkpoint.trust.check_trusted", f"{package}.launch.job.train",
                   f"{package}.models", f"{package}.models.nothing"):  # fmt: skip
        assert not trusted(target), target
    with pytest.raises(ConfigError, match=r"names model.layers\[1\]._target_=evil.f, "):
        check_trusted({"model": {"_target_": "torch.nn.Sequential", "layers": [{}, {"_target_": "evil.f"}]}}, 0, "x")
    with pytest.raises(ConfigError, match=r"names config._target_=evil.f, "):  # the config itself a call
        check_trusted({"_target_": "evil.f"}, False, "x")
    with pytest.raises(ConfigError, match=r"names model._target_=\['os.system'\], "):  # not a name: its repr
        check_trusted({"model": {"_target_": ["os.system"]}}, False, "x")
    with pytest.raises(ConfigError, match=r"holds an interpolation, data.files\[1\]=\$\{oc.env:HOME\}: "):  # in a list
        check_trusted({"data": {"files": ["a.txt", "${oc.env:HOME}"]}}, False, "x")
    check_trusted({"model": {"_target_": "evil.f"}}, True, "x")  # the user's opt-in


def test_a_name_a_saved_config_kept_from_before_a_module_moved_is_trusted_as_what_it_names(monkeypatch) -> None:
    """A checkpoint saved before a module moved names the old path; where the package keeps it importable,
    what it names is trusted as the config files' new name is, and nothing more of the old module."""
    from {{cookiecutter.package_name}}.engine import schedule

    package = "{{cookiecutter.package_name}}"
    monkeypatch.setitem(sys.modules, f"{package}.schedule", schedule)  # the old name, kept by the package
    assert trusted(f"{package}.schedule.Cosine") and trusted(f"{package}.engine.schedule.Cosine")
    assert not trusted(f"{package}.schedule.Schedule"), "the old module's other names: machinery, as before"


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_a_saved_interpolation_is_refused_and_never_reads_the_environment(
    genuine, tmp_path, beside, in_process, monkeypatch, capsys, kind: str
) -> None:
    """A saved config is written resolved: `${oc.env:...}` in one was put there to read this machine's secrets
    into what is built or logged (here the model's width: resolved, it would build and evaluate)."""
    monkeypatch.setenv("TRUST_TEST_WIDTH", "4")
    path = doctored(genuine, kind, tmp_path, "model.width", "${oc.env:TRUST_TEST_WIDTH}")
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}"])
    with pytest.raises(SystemExit) as stopped:
        eval_entry.main()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    said = "error: the checkpoint's config holds an interpolation, model.width=${oc.env:TRUST_TEST_WIDTH}"
    assert err.startswith(said)
    assert err.rstrip().endswith("with trust_checkpoint=true")
    with pytest.raises(SystemExit):
        export_main([str(path), str(tmp_path / "out.pt")])
    assert "holds an interpolation, model.width=" in capsys.readouterr().err and not (tmp_path / "out.pt").exists()
