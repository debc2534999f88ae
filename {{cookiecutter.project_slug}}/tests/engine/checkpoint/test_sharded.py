"""engine/checkpoint/sharded.py: a folder of shards holds the trained weights, read back whole (and into a
plain model, the EMA's where it holds one, as model.init_from reads it too), with every rank's shard file
named; a ddp checkpoint loads into a sharded model and its optimizer; the metadata is read without running
code (a doctored folder, refused as a doctored file is: test_trust.py runs each strategy's); at a resume, a
folder that does not load is set aside for the one before."""

from __future__ import annotations

import copy
import io
import logging
import logging.handlers
import pickle
import subprocess
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.assembly.init_weights import read_weights
from {{cookiecutter.package_name}}.engine.checkpoint import weights
from {{cookiecutter.package_name}}.engine.checkpoint.files import with_owner_tensors
from {{cookiecutter.package_name}}.engine.checkpoint.sharded import (
    MetadataUnpickler,
    SafeReader,
    load_full_state,
    load_into,
    load_owner_tensors,
    read_whole,
    shard_files,
)
from {{cookiecutter.package_name}}.engine.trainer import Trainer
from {{cookiecutter.package_name}}.models import SmallCNN

from ...helpers import CPU, TINY, assert_same, compose_config, on_ranks, record_fsyncs, train_one_epoch


def fit(env: DistEnv, run_dir: Path, *overrides: str) -> None:
    build_trainer(to_train_config(compose_config(list(overrides))), env, run_dir).fit()


@pytest.mark.slow
def test_a_sharded_checkpoint_round_trips_in_a_world_of_one(tmp_path: Path) -> None:
    """fsdp over one process: the folder of shards holds the trained weights, read back whole; a ddp run of
    the same job trains the same weights. (As plain python, `python train.py`, a world of one:
    tests/e2e/test_training.py.)"""
    job = ["task=classification", "model=small_cnn", "data=synthetic", "data.train_size=64", "data.val_size=20",
           "data.batch_size=16", "trainer.epochs=1", "checkpoint.every_n_steps=2"]  # fmt: skip
    for strategy in ("fsdp", "ddp"):
        on_ranks(1, fit, tmp_path / strategy, f"strategy={strategy}", *job)
    folder = tmp_path / "fsdp" / "checkpoints" / "step_00000004"
    whole = read_whole(folder)
    ddp = torch.load(tmp_path / "ddp" / "checkpoints" / "step_00000004.pt", weights_only=True)
    for name, tensor in ddp["model"].items():
        assert torch.allclose(whole["model"][name], tensor, atol=1e-6), name
    assert set(whole["optimizer"]["state"]) == {name for name, _ in SmallCNN(num_classes=10).named_parameters()}


def test_the_shards_metadata_is_read_without_running_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(tmp_path / "pwned")],))

    folder = tmp_path / "step_00000001"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match="subprocess.call is not part of a checkpoint's metadata"):
        SafeReader(folder).read_metadata()
    assert not (tmp_path / "pwned").exists()
    with open(folder / ".metadata", "rb") as file, pytest.raises(pickle.UnpicklingError):
        MetadataUnpickler(file).load()
    # Protocol 4 names a global by a path: through DCP's own module to the os it imports; or a function that
    # module imports, or one of torch beside its dtypes. Each refused, nothing run.
    for module, name, argument in [("torch.distributed.checkpoint.filesystem", "os.system", f"touch {tmp_path}/pwned"),
                                   ("torch.distributed.checkpoint.metadata", "dataclass", "x"),
                                   ("torch", "set_default_dtype", "x")]:  # fmt: skip
        code = b"".join(pickle.SHORT_BINUNICODE + bytes([len(text)]) + text.encode() for text in (module, name))
        call = pickle.PROTO + b"\x04" + code + pickle.STACK_GLOBAL + pickle.SHORT_BINUNICODE + bytes([len(argument)])
        payload = call + argument.encode() + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP
        with pytest.raises(pickle.UnpicklingError, match=f"^{module}.{name} is not part of a checkpoint's metadata$"):
            MetadataUnpickler(io.BytesIO(payload)).load()
    assert not (tmp_path / "pwned").exists()


def test_a_value_beside_the_tensors_loads_as_a_plain_value_only(tmp_path: Path) -> None:
    """DCP pickles the values that are not tensors (the optimizer's settings) with torch.save: they load
    with weights_only=True, into live state (a resume) and whole (eval.py, the export): nothing runs."""
    import torch.distributed.checkpoint as dcp

    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(tmp_path / "pwned")],))

    for name, value in (("plain", "cosine"), ("evil", Evil())):
        dcp.save({"w": torch.ones(2), "settings": value}, checkpoint_id=tmp_path / name, no_dist=True)
    state = {"w": torch.zeros(2), "settings": None}
    load_into(tmp_path / "plain", state)
    assert state["settings"] == "cosine" and torch.equal(state["w"], torch.ones(2))
    for load in (lambda: load_into(tmp_path / "evil", {"w": torch.zeros(2), "settings": None}),
                 lambda: read_whole(tmp_path / "evil")):  # fmt: skip
        with pytest.raises(BaseException) as refused:  # DCP's CheckpointException (a BaseException) wraps it
            load()
        assert "Weights only load failed" in str(refused.value), str(refused.value)[-600:]
    assert not (tmp_path / "pwned").exists()


def test_a_resumes_owners_read_their_tensors_from_a_folder_of_shards_and_take_a_files_payload_as_it_is(
    tmp_path: Path,
) -> None:
    """What the trainer and CheckpointManager hand the owners (the EMA) at a resume: a folder's trainer.pt
    payload holds no tensors, so theirs are read in place into their live ones; a file's payload has them."""
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "step_00000001"
    dcp.save({"model": {"w": torch.ones(2)}, "ema": {"w": torch.full((2,), 3.0)}}, checkpoint_id=folder, no_dist=True)
    live = {"w": torch.zeros(2)}
    owner = SimpleNamespace(state_dict=lambda: {"ema": live})
    given = with_owner_tensors({"step": 1}, folder, [owner])
    assert given["step"] == 1 and given["ema"] is live and torch.equal(live["w"], torch.full((2,), 3.0))
    payload = {"model": {"w": torch.ones(2)}, "ema": {"w": torch.ones(2)}, "step": 1}
    assert with_owner_tensors(payload, tmp_path / "step_00000001.pt", [owner]) is payload


def test_a_folder_of_shards_that_does_not_load_as_init_from_is_one_line(tmp_path: Path, caplog) -> None:
    """Its `.metadata` unpickled by DCP fails as a CheckpointException, a BaseException that carries a
    traceback per attempt and escapes `except Exception`: a worker's crash, restarted; here a ConfigError."""
    import torch.distributed.checkpoint as dcp

    lines = {"metadata": r"its \.metadata does not load: UnpicklingError: os\.system is not part of a checkpoint's "
                         r"metadata\)$",
             "shard": r"its shards do not load: \w+"}  # fmt: skip
    for broken, line in lines.items():
        folder = tmp_path / broken / "step_00000004"
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.save({"model": SmallCNN(num_classes=10).state_dict()}, checkpoint_id=folder, no_dist=True)
        if broken == "metadata":
            (folder / ".metadata").write_bytes(b"\x80\x04cos\nsystem\n.")
        else:
            shard = next(folder.glob("*.distcp"))
            shard.write_bytes(shard.read_bytes()[:100])
        caplog.clear()
        refused = f"^model.init_from={folder}: not a folder of shards that loads \\({line}"
        with pytest.raises(ConfigError, match=refused):
            build_trainer(to_train_config(compose_config([*STEP, f"model.init_from={folder}"])), CPU, tmp_path / "b")
        assert not [record for record in caplog.records if record.exc_info], broken  # no traceback logged


# --- two fsdp ranks in-process (tests/helpers.py's on_ranks): their checkpoints, read here

STEP = ["model=small_cnn", "data=synthetic", "data.train_size=16", "data.val_size=4", "data.batch_size=4"]


def one_step(env: DistEnv, run_dir: Path, *overrides: str) -> Trainer:
    """SmallCNN's trainer after one optimizer step: momentum, BatchNorm statistics and the EMA are not fresh."""
    trained = build_trainer(to_train_config(compose_config([*STEP, *overrides])), env, run_dir)
    inputs, targets, weights, _ = next(iter(trained.data.train_loader))
    trained.runner.micro_step(inputs, targets, weights, real_samples=env.world_size * len(weights), sync=True)
    trained.runner.optimizer_step()
    trained.ema.update(1)
    trained.state.step = 1
    return trained


def gathered(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole copies of the tensors (a collective where they are DTensors: every rank calls it)."""
    return {name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone() for name, t in tensors.items()}


def save_sharded(env: DistEnv, tmp_path: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Step 1's checkpoint of two fsdp runs, without and with trainer.ema; the live weights (gathered on
    rank 0) and the EMA's, as they were saved."""
    live: dict = {"synced": record_fsyncs()}  # this rank's process only
    for name, ema in (("plain", "0.0"), ("ema", "0.5")):
        trained = one_step(env, tmp_path / name, "strategy=fsdp", f"trainer.ema.decay={ema}")
        trained.save()
        trained.checkpoints.wait()
        live[name] = gathered(trained.strategy.full_weights())
        live[f"{name}_average"] = gathered(trained.ema.state_dict().get("ema", {}))
    return live


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """save_sharded's folders (under the returned root) and what was live, made once for the tests that read them."""
    root = tmp_path_factory.mktemp("two_ranks")
    return root, on_ranks(2, save_sharded, root)[0]


@pytest.fixture
def ema_folder(two_ranks) -> Path:
    """Two fsdp ranks' folder of shards, which kept an EMA of its weights."""
    return two_ranks[0] / "ema" / "checkpoints" / "step_00000001"


@pytest.mark.slow
def test_two_ranks_shards_read_back_whole_are_the_live_weights_and_load_into_a_plain_model(two_ranks) -> None:
    root, live = two_ranks
    plain, averaged = (root / name / "checkpoints" / "step_00000001" for name in ("plain", "ema"))
    assert shard_files(plain) == shard_files(averaged) == ["__0_0.distcp", "__1_0.distcp"], "each rank's, once"
    synced = [path for path in live["synced"] if "/plain/" in path]  # rank 0's: its shard, trainer.pt, the folders
    tmp = str(root / "plain" / "checkpoints" / ".tmp_step_00000001")
    assert f"{tmp}/__0_0.distcp" in synced, "DCP's writer syncs the shard (sync_files)"
    last = synced.index(str(root / "plain" / "checkpoints"))
    assert any(path.startswith(f"{tmp}/.tmp_trainer.pt.") for path in synced[:last]), "trainer.pt, then the rename"
    assert last == len(synced) - 1, "the folder holding the renamed checkpoint, last"

    whole = read_whole(plain)
    assert sorted(whole) == ["model", "optimizer"], "no EMA in a run without it"
    assert_same(whole["model"], live["plain"], "the shards read whole")
    assert whole["model"]["0.1.num_batches_tracked"] == 1 and whole["model"]["0.1.running_mean"].abs().sum() > 0
    assert sorted(whole["optimizer"]["state"]) == sorted(name for name, _ in SmallCNN(10).named_parameters())
    assert sorted(read_whole(averaged)) == ["ema", "model", "optimizer"]
    assert_same(read_whole(averaged)["ema"], live["ema_average"], "the EMA's shards read whole")

    model = SmallCNN(num_classes=10)  # as eval.py and the export read a folder (weights.py), whatever wrote it
    assert not weights.has_ema(plain, weights.load_weights(plain, model))
    assert_same(model.state_dict(), live["plain"], "a plain model: the trained weights and buffers")
    assert weights.has_ema(averaged, weights.load_weights(averaged, model))
    assert_same(model.state_dict(), {**live["ema"], **live["ema_average"]}, "the EMA's parameters, the buffers")
    assert not torch.equal(live["ema"]["7.weight"], live["ema_average"]["7.weight"]), "the average is not the weights"

    # A resume's owners beyond the model and the optimizer (the EMA) get their tensors where the folder has them.
    fresh = {name: torch.zeros_like(tensor) for name, tensor in live["ema_average"].items()}
    owner = SimpleNamespace(state_dict=lambda: {"ema": fresh})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a load in one process, as meant: nothing to warn about
        assert load_owner_tensors(plain, [owner]) == {}, "a run without the EMA: nothing read, nothing refused"
        assert_same(load_owner_tensors(averaged, [owner])["ema"], live["ema_average"], "the EMA's, into its tensors")


@pytest.mark.slow
def test_a_folder_of_shards_that_kept_an_ema_gives_its_average(ema_folder: Path) -> None:
    """As model.init_from reads it (engine/assembly/init_weights.py): the EMA's parameters, the buffers."""
    whole, read = read_whole(ema_folder), read_weights(ema_folder)
    assert whole["ema"].keys() < read.keys() and read.keys() == whole["model"].keys()
    assert all(torch.equal(read[name], whole["ema"][name]) for name in whole["ema"])
    assert not all(torch.equal(whole["model"][name], whole["ema"][name]) for name in whole["ema"]), "not the weights"


# SmallCNN's parameters as the project's optimizer numbers them (components.build_optimizer): the
# weights (with decay) first, then the biases and the normalisation's (without), each in model order.
OPTIMIZER_ORDER = ["0.0.weight", "2.0.weight", "4.0.weight", "7.weight", "0.1.weight", "0.1.bias", "2.1.weight",
                   "2.1.bias", "4.1.weight", "4.1.bias", "7.bias"]  # fmt: skip


def settings(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An optimizer's param_groups less their parameters: lr, momentum, weight_decay..."""
    return [{key: value for key, value in group.items() if key != "params"} for group in groups]


def ddp_into_fsdp(env: DistEnv, tmp_path: Path) -> dict[str, Any]:
    """A ddp trainer's state after a step (what its step_<N>.pt holds), loaded into a fresh fsdp trainer of
    another learning rate: the source, whether each momentum is held as the rank's shard, and the sharded
    model's weights and optimizer state gathered whole."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    source = one_step(env, tmp_path / "ddp", "strategy=ddp", "optim.lr=0.05").strategy.state_dict()
    sharded = build_trainer(to_train_config(compose_config([*STEP, "strategy=fsdp"])), env, tmp_path / "fsdp")
    model, optimizer = sharded.model, sharded.optimizer
    before = settings(optimizer.param_groups)
    kept = copy.deepcopy(source)  # torch's loader lays the whole tensors it is given out as shards, in place
    load_full_state(model, optimizer, source["model"], source["optimizer"])
    as_shards = {}
    for name, parameter in model.named_parameters():
        held = optimizer.state[parameter]["momentum_buffer"]
        laid_out = isinstance(held, DTensor) and held.placements == parameter.placements
        as_shards[name] = laid_out and held.to_local().shape == parameter.to_local().shape
    full = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {
        "source": kept,
        "before": before,
        "as_shards": as_shards,
        "weights": gathered(sharded.strategy.full_weights()),
        "state": {name: gathered(state) for name, state in full["state"].items()},
        "groups": full["param_groups"],
    }


@pytest.mark.slow
def test_a_ddp_checkpoint_loads_into_a_sharded_model_and_optimizer_each_parameter_by_its_number(
    tmp_path: Path,
) -> None:
    loaded = on_ranks(2, ddp_into_fsdp, tmp_path)[0]
    source = loaded["source"]
    assert_same(loaded["weights"], source["model"], "the sharded model's weights and buffers, gathered")
    assert loaded["as_shards"] == dict.fromkeys(OPTIMIZER_ORDER, True), "each rank holds its shard of the momentum"
    assert sorted(source["optimizer"]["state"]) == list(range(11)), "torch.optim's: by parameter number"
    assert sorted(loaded["state"]) == sorted(OPTIMIZER_ORDER)
    for number, name in enumerate(OPTIMIZER_ORDER):
        assert_same(loaded["state"][name], source["optimizer"]["state"][number], f"{name}'s momentum")
    assert [group["params"] for group in loaded["groups"]] == [OPTIMIZER_ORDER[:4], OPTIMIZER_ORDER[4:]]
    saved = settings(source["optimizer"]["param_groups"])
    assert settings(loaded["groups"]) == saved, "the param_groups' settings, as saved"
    assert [(group["lr"], group["weight_decay"]) for group in saved] == [(0.05, 5e-4), (0.05, 0.0)]
    assert [group["lr"] for group in loaded["before"]] == [0.1, 0.1], "the fsdp run's own lr, replaced"


# --- a resume: past a folder that does not load (engine/checkpoint/manager.py)


def resume_past_a_corrupt_shard(env, run_dir: Path) -> tuple[int, list[str]]:
    """Sharded checkpoints at steps 2 and 4 of a 6-step epoch; rank 1's shard of the newest cut in half;
    a relaunch, whose writer renames the checkpoint it sets aside only once the resume is done: the
    latest any rank can see the rename (a rank that looks for the one before sooner must skip it itself)."""
    from {{cookiecutter.package_name}}.engine.checkpoint.writer import Checkpointer

    overrides = [*TINY, "data.batch_size=8", "strategy=fsdp", "checkpoint.every_n_steps=2"]
    config = to_train_config(compose_config(overrides))
    trained = build_trainer(config, env, run_dir)
    train_one_epoch(trained)
    torch.distributed.barrier()
    if env.rank == 0:
        shard = run_dir / "checkpoints" / "step_00000004" / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    torch.distributed.barrier()
    heard: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("{{cookiecutter.package_name}}.engine.checkpoint.manager").addHandler(handler)
    held_back, set_aside = [], Checkpointer.set_aside
    Checkpointer.set_aside = lambda writer, path: held_back.append((writer, path))  # type: ignore[method-assign]
    resumed = build_trainer(config, env, run_dir)
    for writer, path in held_back:
        set_aside(writer, path)
    return resumed.state.step, heard


@pytest.mark.slow
def test_a_sharded_checkpoint_that_does_not_load_is_set_aside_for_the_one_before(tmp_path: Path) -> None:
    for step, heard in on_ranks(2, resume_past_a_corrupt_shard, tmp_path, timeout=60):
        assert step == 2, "resumed from the checkpoint before"
        warned = [line for line in heard if " does not load (" in line]
        assert len(warned) == 1 and warned[0].startswith(f"checkpoint {tmp_path / 'checkpoints' / 'step_00000004'} "
                                                         "does not load ("), heard  # fmt: skip
        reason = warned[0].split(" does not load (", 1)[1].removesuffix("); trying the one before")
        assert warned[0].endswith("); trying the one before") and reason.startswith("CheckpointException: "), warned[0]
        assert "\n" not in reason, warned[0]  # the error's first line
    assert (tmp_path / "checkpoints" / "step_00000004.unreadable").is_dir()
