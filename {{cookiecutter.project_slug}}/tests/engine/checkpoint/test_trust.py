"""engine/checkpoint/trust.py: a checkpoint from elsewhere runs no code. Doctored copies of real checkpoints
(a whole .pt, and a folder of shards where the project writes them: one of each strategy's) name code outside
the project; eval.py, the export and model.init_from refuse each in one line before anything is imported or
built, and run it only with the user's opt-in."""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import {{cookiecutter.package_name}}
from {{cookiecutter.package_name}} import eval as eval_entry
from {{cookiecutter.package_name}} import predict as predict_entry
from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.run_dir import FINISHED_MARKER
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.assembly.init_weights import read_weights
from {{cookiecutter.package_name}}.engine.checkpoint.trust import check_data_paths, check_trusted, trusted
from {{cookiecutter.package_name}}.export import main as export_main

from ...helpers import STRATEGIES, WIDEST, compose_config, cpu_env, on_ranks

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


def tiny_run(env, run_dir: Path, *overrides: str) -> None:  # noqa: ANN001
    """One step of a tiny training, its checkpoint written (step_00000001, a .pt or a folder of shards)."""
    build_trainer(to_train_config(compose_config([*TINY, *overrides])), env, run_dir).fit()


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> dict[str, Path]:
    """Each strategy's checkpoint of one tiny training: a whole .pt (ddp, in this process), and a folder of
    shards where the project has a strategy that writes them (one rank)."""
    root = tmp_path_factory.mktemp("genuine")
    tiny_run(cpu_env(0, 1), root / "ddp")
    found = {"ddp": root / "ddp" / "checkpoints" / "step_00000001.pt"}
    for strategy in STRATEGIES[1:]:
        on_ranks(1, tiny_run, root / strategy, f"strategy={strategy}")
        found[strategy] = root / strategy / "checkpoints" / "step_00000001"
    return found


def doctored(genuine: dict[str, Path], kind: str, tmp_path: Path, key: str, target: Any) -> Path:
    """A copy of a genuine checkpoint (a file, or a folder of shards whose config is in its trainer.pt) whose
    saved config names `target` at `key`, with PAYLOAD beside it on Python's path (as a folder shipped with
    a download is when one runs from it)."""
    source = genuine[kind]
    copy = tmp_path / "shared" / source.name
    if source.is_dir():
        shutil.copytree(source, copy)
        trainer_file = copy / "trainer.pt"
    else:
        copy.parent.mkdir()
        trainer_file = copy
    payload = torch.load(source / "trainer.pt" if source.is_dir() else source, weights_only=True)
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
        *((kind, "model._target_", "payload_module.Payload") for kind in STRATEGIES),  # a module shipped beside it
        ("ddp", "data.dataset._target_", "os.system"),  # nested, a function Hydra's blocklist names
        (WIDEST, "task._target_", "torch.nn.modules.module.os.system"),  # through torch's own modules
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


@pytest.mark.parametrize("kind", STRATEGIES)
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
                   "torchvision.models.resnet18", "torchvision.models.resnet.resnet50",
                   f"{package}.engine.schedule.Cosine", f"{package}.datasets.synthetic_images",
                   f"{package}.datasets.images.synthetic_images"):  # fmt: skip  # the name configs give, its home
        assert trusted(target), target
    for target in ("os.system", "builtins.exec", "torch.nn.functional.relu", "torchvision.models.get_model",
                   "torch.hub.load", f"{package}.models.os.system", f"{package}.launch.main.main",
                   f"{package}.engine.checkpoint.files.write_atomically", "torch.optim.Optimizer.step"):  # fmt: skip
        assert not trusted(target), target
    # The package's own names: what it registers (BUILDABLE) is trusted, named by no config file or not;
    # the rest is not, the user's side of the package included (test_every_public_callable_... below).
    for target in (f"{package}.models.MixtureOfExperts", f"{package}.callbacks.FreezeUntil"):
        assert trusted(target), target
    for target in (f"{package}.engine.checkpoint.trust.check_trusted", f"{package}.launch.job.train",
                   f"{package}.models", f"{package}.models.nothing", f"{package}.datasets.images.TensorImages",
                   f"{package}.common.run_dir.clear_markers"):  # fmt: skip
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


@pytest.mark.parametrize("kind", STRATEGIES)
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


# --- the allowlist: what the package registers, its configs name, torch's classes; nothing else of it

# Every public callable of the package a checkpoint may build: its config files' targets and its registries
# (BUILDABLE of models/, tasks/, datasets/__init__.py, datasets/collate.py, callbacks.py). A new one of the
# modules every project has is refused until it is registered, and then listed here; a module beside them
# (a model's, a task's or a data set's own, which a project may be made without) by its BUILDABLE, which its
# own tests name.
BUILDABLE = {
    "models.SmallCNN", "models.MixtureOfExperts",
    "tasks.Classification", "tasks.InfoNCE", "tasks.ClassificationWithAux",
    "datasets.images.synthetic_images", "datasets.images.cifar10", "datasets.images.image_folder",
    "datasets.collate.pad_sequences", "datasets.collate.pad_windows",
    "callbacks.FreezeUntil", "callbacks.LogWeightNorm", "callbacks.SecondValidation",
    "engine.schedule.Cosine", "engine.schedule.Constant",
}  # fmt: skip
LISTED_MODULES = {name.rsplit(".", 1)[0] for name in BUILDABLE} | {"models", "tasks"}  # __init__.py's own


def registered_beside() -> set[str]:
    """The BUILDABLE of every module of models/, tasks/ and datasets/ not listed above, as dotted names."""
    names = set()
    for folder in ("models", "tasks", "datasets"):
        package = importlib.import_module(f"{{cookiecutter.package_name}}.{folder}")
        for info in pkgutil.iter_modules(package.__path__):
            if f"{folder}.{info.name}" in LISTED_MODULES:
                continue
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            names |= {f"{folder}.{info.name}.{item.__name__}" for item in getattr(module, "BUILDABLE", ())}
    return names


def public_callables() -> Iterator[tuple[str, Any]]:
    """(dotted name, object) of every public function and class defined in a module of the package (a
    `__main__` runs when imported, and defines nothing)."""
    for info in pkgutil.walk_packages({{cookiecutter.package_name}}.__path__, "{{cookiecutter.package_name}}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == info.name:
                yield f"{info.name}.{name}", value


def test_every_public_callable_of_the_package_off_the_allowlist_is_refused(monkeypatch) -> None:
    found = dict(public_callables())
    assert len(found) > 300 and "{{cookiecutter.package_name}}.common.run_dir.clear_markers" in found
    allowed = {f"{{cookiecutter.package_name}}.{name}" for name in BUILDABLE | registered_beside()}
    assert allowed <= found.keys()
    for target in found:
        node = {"model": {"_target_": "torch.nn.Sequential", "extra": {"_target_": target}}}
        if target in allowed:
            assert trusted(target), target
            check_trusted(node, False, "x")
            continue
        assert not trusted(target), f"{target} is not registered, yet a checkpoint may build it"
        with pytest.raises(ConfigError, match=rf"^the checkpoint's config names model.extra._target_={target}, "):
            check_trusted(node, False, "x")

    def added() -> None: ...

    added.__module__ = "{{cookiecutter.package_name}}.models"
    monkeypatch.setattr({{cookiecutter.package_name}}.models, "added", added, raising=False)
    assert not trusted("{{cookiecutter.package_name}}.models.added"), "a function added tomorrow: refused until registered"


def test_a_package_function_in_a_nested_node_is_refused_by_every_command_before_it_runs(
    genuine, tmp_path, in_process, monkeypatch, capsys
) -> None:
    """The issue's case: a genuine checkpoint whose model node holds a node naming a function of the package
    that deletes files of the folder it is given (a run dir's markers, before a job). Each command refuses it
    in one line, exit code 2."""
    victim = tmp_path / "victim" / FINISHED_MARKER
    victim.parent.mkdir()
    victim.write_text("kept")
    target = "{{cookiecutter.package_name}}.common.run_dir.clear_markers"
    evil = {"_target_": target, "run_dir": str(victim.parent)}
    path = doctored(genuine, "ddp", tmp_path, "model.extra", evil)
    # (Each other command on a checkpoint refuses it too: its own test file, with this file's `doctored`.)
    commands = [(eval_entry, ["eval.py"]), (predict_entry, ["predict.py", f"out={tmp_path / 'p.pt'}"])]
    for entry, argv in commands:
        monkeypatch.setattr(sys, "argv", [*argv, f"ckpt_path={path}"])
        with pytest.raises(SystemExit) as stopped:
            entry.main()
        assert stopped.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"names model.extra._target_={target}, " in err, err
    with pytest.raises(SystemExit) as stopped:
        export_main([str(path), str(tmp_path / "out.pt")])
    assert stopped.value.code == 2 and f"model.extra._target_={target}" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=rf"names model.extra._target_={target}, "):
        read_weights(path)
    assert victim.read_text() == "kept" and not (tmp_path / "out.pt").exists()


def test_a_torchvision_builder_is_never_given_weights_to_download_by_a_checkpoint(
    genuine, tmp_path, in_process, monkeypatch, capsys
) -> None:
    builder = {"_target_": "torchvision.models.resnet18", "num_classes": 10}
    for name, value in (("weights", "IMAGENET1K_V1"), ("pretrained", True), ("weights_backbone", "DEFAULT")):
        with pytest.raises(ConfigError, match=rf"gives model.{name}={value} to model._target_=torchvision.models."):
            check_trusted({"model": {**builder, name: value}}, False, "x")
        check_trusted({"model": {**builder, name: value}}, False, "x", given={f"model.{name}"})  # the user's
    check_trusted({"model": {**builder, "weights": None, "pretrained": False}}, False, "x")
    path = doctored(genuine, "ddp", tmp_path, "model", {**builder, "weights": "IMAGENET1K_V1"})
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}"])
    with pytest.raises(SystemExit) as stopped:
        eval_entry.main()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert "model.weights=IMAGENET1K_V1 to model._target_=torchvision.models.resnet18: a download" in err


def test_a_data_path_of_the_checkpoint_is_read_only_where_the_command_or_a_config_names_it(
    genuine, tmp_path, in_process, monkeypatch, capsys
) -> None:
    """A checkpoint never picks what eval.py and predict read, cache, evict or fetch: a path of its data node
    must be one the command gives (or a config file of the project holds); a download, the command's."""
    images = {"_target_": "{{cookiecutter.package_name}}.datasets.image_folder", "root": str(tmp_path / "elsewhere"),
              "image_size": 8, "num_classes": 10}  # fmt: skip
    path = doctored(genuine, "ddp", tmp_path, "data.dataset", images)
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}"])
    with pytest.raises(SystemExit) as stopped:
        eval_entry.main()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    said = (f"gives data.dataset.root={tmp_path / 'elsewhere'} to "
            "data.dataset._target_={{cookiecutter.package_name}}.datasets.image_folder")  # fmt: skip
    assert said in err and "give it on the command line" in err, err
    node = {"root": "/data/x", "dataset": {"_target_": "t", "root": "/data/x", "cache_dir": "/scratch/c"}}
    with pytest.raises(ConfigError, match=r"gives data.root=/data/x to data.dataset._target_=t, a path"):
        check_data_paths(node, set(), set(), "x")
    with pytest.raises(ConfigError, match=r"gives data.dataset.cache_dir=/scratch/c to "):
        check_data_paths(node, {"/data/x"}, {"data.root"}, "x")
    check_data_paths(node, {"/data/x", "/scratch/c"}, {"data.root"}, "x")  # the command gave them
    check_data_paths({"root": "data/cifar10", "dataset": {"_target_": "t", "root": "data/cifar10"}}, set(), set(), "x")
    check_data_paths({"dataset": {"_target_": "t", "split": "train", "size": 3}}, set(), set(), "x")  # no path
    with pytest.raises(ConfigError, match=r"gives data.dataset.download=True to data.dataset._target_=t: a download"):
        check_data_paths({"dataset": {"_target_": "t", "download": True}}, set(), set(), "x")
    check_data_paths({"dataset": {"_target_": "t", "download": True}}, set(), {"data.download"}, "x")


def test_a_checkpoint_without_a_config_mapping_is_refused_in_one_line(
    genuine, tmp_path, in_process, monkeypatch, capsys
) -> None:
    for value, said in ((None, "holds no config"), ("x", "holds a config that is a str, not a mapping")):
        payload = torch.load(genuine["ddp"], weights_only=True)
        payload.pop("config") if value is None else payload.update(config=value)
        path = tmp_path / f"{value}.pt"
        torch.save(payload, path)
        monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}"])
        with pytest.raises(SystemExit) as stopped:
            eval_entry.main()
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and err.count("\n") == 1 and said in err, err
        with pytest.raises(SystemExit) as stopped:
            export_main([str(path), str(tmp_path / "out.pt")])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and err.count("\n") == 1 and said in err, err
    with pytest.raises(ConfigError, match="holds a config that is a str, not a mapping"):
        read_weights(tmp_path / "x.pt")  # model.init_from; a file without a config is plain weights
    assert "0.0.weight" in read_weights(tmp_path / "None.pt")


def test_callbacks_and_a_task_the_command_gives_are_not_the_checkpoints_to_answer_for(
    genuine, tmp_path, beside, in_process, monkeypatch, capsys
) -> None:
    """eval.py and the export build no callbacks, so judge none; a task the command names is the user's."""
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={genuine['ddp']}"])
    eval_entry.main()
    figures = capsys.readouterr().out
    path = doctored(genuine, "ddp", tmp_path, "callbacks", {"mine": {"_target_": "payload_module.Payload"}})
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}"])
    eval_entry.main()
    assert capsys.readouterr().out == figures
    export_main([str(path), str(tmp_path / "out.pt")])
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'out.pt'}: weights at step 1")
    payload = torch.load(path, weights_only=True)
    payload["config"]["task"]["_target_"] = "payload_module.Payload"
    torch.save(payload, path)
    given = "task._target_={{cookiecutter.package_name}}.tasks.Classification"
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={path}", given])
    eval_entry.main()
    assert capsys.readouterr().out == figures and not (beside / "ran").exists()
