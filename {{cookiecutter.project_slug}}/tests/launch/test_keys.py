"""launch/keys.py: the command line sorted into keys, Hydra's flags, overrides and torchrun's flags;
the keys the command line leaves out, from the environment and cluster.env; a bad key is one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch.keys import KEYS, SCRIPTS, LaunchError, parse_args, read_cluster_env, usage
from {{cookiecutter.package_name}}.launch.modes import extra_modes

from ..helpers import PROJECT_DIR, planned


def test_the_command_line_is_sorted_into_keys_hydra_flags_overrides_and_torchrun_flags() -> None:
    args = parse_args(["NPROC_PER_NODE=3", "--cfg", "job", "model=resnet18", "-m", "optim.lr=0.1,0.2", "--",
                       "--log-dir=/tmp/x", "--redirects=3"], "single")  # fmt: skip
    assert args.keys == {"NPROC_PER_NODE": "3"} and args.multirun
    assert args.hydra_flags == ["--cfg", "job"] and args.overrides == ["model=resnet18", "optim.lr=0.1,0.2"]
    assert args.torchrun_flags == ["--log-dir=/tmp/x", "--redirects=3"]
    assert parse_args(["--info", "defaults", "--help"], "single").hydra_flags == ["--info", "defaults"]
    assert parse_args(["--multirun", "optim.lr=0.1,0.2"], "single").multirun, "-m's long form"
    assert parse_args(["--help"], "single").help and parse_args(["-h"], "multi").help


@pytest.mark.parametrize(
    "environ",
    [
        {"NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29123", "NNODES": "3"},
        {"PET_NODE_RANK": "1", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "29123", "PET_NNODES": "3"},
    ],
)
def test_a_schedulers_environment_fills_the_keys_the_command_line_leaves_out(environ: dict[str, str]) -> None:
    launch = planned("multi", "NPROC_PER_NODE=1", environ=environ)
    assert {"--nnodes=3", "--node-rank=1", "--master-addr=127.0.0.1", "--master-port=29123"} <= set(
        launch.torchrun_args
    )
    mine = planned("multi", "NPROC_PER_NODE=1", "NODE_RANK=2", environ=environ)
    assert "--node-rank=2" in mine.torchrun_args, "the command line wins"


def test_cluster_env_gives_defaults_below_the_environment(tmp_path: Path) -> None:
    (tmp_path / "cluster.env").write_text("# a comment\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29321\nNNODES=4\n")
    cluster = read_cluster_env(tmp_path / "cluster.env")
    assert cluster == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29321", "NNODES": "4"}
    launch = planned("multi", "NODE_RANK=1", "NPROC_PER_NODE=1", environ={"NNODES": "2"}, cluster=cluster)
    assert {"--nnodes=2", "--master-port=29321"} <= set(launch.torchrun_args)


@pytest.mark.parametrize(
    ("mode", "argv", "message"),
    [
        ("single", ["FOO=1"], "unknown key FOO"),
        ("single", ["NPROC_PER_NODE=two"], "NPROC_PER_NODE=two is not a whole number"),
        ("single", ["NPROC_PER_NODE=0"], "NPROC_PER_NODE=0 must be at least 1"),
        ("single", ["MAX_RESTARTS=-1"], "MAX_RESTARTS=-1 is not a whole number"),
        ("single", ["--bogus"], "unknown flag --bogus: give torchrun's flags after --"),
        ("single", ["GPUS=a,b"], "GPUS=a,b: give GPU indices separated by commas"),
        ("single", ["GPUS=1,1"], "GPUS=1,1 lists a GPU twice"),
        ("multi", [], "NODE_RANK is required"),
        ("multi", ["NODE_RANK=2", "NNODES=2"], "NODE_RANK=2 is outside 0..1 for NNODES=2"),
        ("multi", ["NODE_RANK=0", "NNODES=two"], "NNODES=two is not a whole number"),
        ("multi", ["NODE_RANK=0", "NNODES=3:2"], "NNODES=3:2: MIN is larger than MAX"),
        ("multi", ["NODE_RANK=0", "NPROC_PER_NODE=1.5"], "NPROC_PER_NODE=1.5 is not a whole number"),
        ("multi", ["NODE_RANK=1"], "MASTER_ADDR is required on node 1"),
        ("multi", ["NODE_RANK=0", "MASTER_PORT=70000"], "MASTER_PORT=70000 is outside 1..65535"),
        ("multi", ["NODE_RANK=0", "MASTER_PORT=0"], "MASTER_PORT=0 must be at least 1"),
        ("multi", ["NODE_RANK=1", "MASTER_ADDR=no-such-host.invalid"], "MASTER_ADDR=no-such-host.invalid does not"),
    ],
)
def test_bad_keys_are_one_line_errors(mode: str, argv: list[str], message: str) -> None:
    with pytest.raises(LaunchError) as error:
        planned(mode, *argv)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_help_lists_every_key_with_its_default() -> None:
    text = usage("multi")
    for key in KEYS:
        if "multi" in key.modes:
            assert re.search(rf"^  {key.name} +{re.escape(key.default or '-')} ", text, flags=re.M), key.name
    assert "RDZV_LAST_CALL_S" in text and "RUN_DIR" in text and "MASTER_ADDR" not in usage("single")
    scripts = {**SCRIPTS, **{mode: module.SCRIPT for mode, module in extra_modes().items()}}
    assert set(scripts.values()) == {path.name for path in (PROJECT_DIR / "scripts").glob("*.sh")}
    for mode, script in scripts.items():
        assert usage(mode).startswith(f"usage: bash scripts/{script} [KEY=VALUE ...]"), mode
