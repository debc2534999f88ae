"""engine/assembly/entry.py, what a worker fixes up before training: the legacy launcher's argument (the checks it
runs as it starts: tests/engine/assembly/test_checks.py); a refusal under the launcher, told to it and to the other
nodes."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.run_dir import CONTROL_DIR_ENV, FAILED_MARKER, REFUSED
from {{cookiecutter.package_name}}.engine.assembly.entry import accept_legacy_local_rank, refuse, reporting_user_errors
from {{cookiecutter.package_name}}.engine.distributed.process_group import REFUSED_KEY


@pytest.fixture(autouse=True)
def environ_restored() -> Iterator[None]:
    """accept_legacy_local_rank sets LOCAL_RANK in os.environ itself: the tests after these get theirs back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--local-rank=1", "trainer.epochs=2"],
        ["train.py", "--local_rank=1", "trainer.epochs=2"],
        ["train.py", "--local-rank", "1", "trainer.epochs=2"],
    ],
)
def test_legacy_local_rank_argument_is_accepted(argv, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    accept_legacy_local_rank(argv)
    assert argv == ["train.py", "trainer.epochs=2"]
    assert os.environ["LOCAL_RANK"] == "1"


def refusing(tell: bool) -> None:
    refuse(ConfigError("data.root=/x: no such folder"), tell=tell)  # ends the process (os._exit)


@pytest.mark.parametrize("tell", [True, False], ids=["its own refusal", "one read from another node"])
def test_a_refusal_under_the_launcher_goes_to_it_and_to_the_other_nodes_unless_it_came_from_one(tmp_path, tell):
    import datetime
    import multiprocessing

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))
    os.environ.update({CONTROL_DIR_ENV: str(tmp_path), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
                       "GROUP_WORLD_SIZE": "2", "GROUP_RANK": "1", "RANK": "1",
                       "TORCHELASTIC_USE_AGENT_STORE": "True"})  # fmt: skip
    worker = multiprocessing.get_context("fork").Process(target=refusing, args=(tell,))
    worker.start()
    worker.join(30)
    assert worker.exitcode == 0, "ended well: torchrun restarts no one, the launcher stops the job"
    assert (tmp_path / FAILED_MARKER).read_text() == f"data.root=/x: no such folder\n2\n{REFUSED}\n"
    if tell:
        assert server.check([REFUSED_KEY]), "said to the other nodes"
        assert server.get(REFUSED_KEY) == b"node 1 refused the job: data.root=/x: no such folder"
    else:
        assert not server.check([REFUSED_KEY]), "another node's line is not said back"


def failing_in_a_collective() -> None:
    def body() -> None:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:5283")

    reporting_user_errors(body)


@pytest.mark.parametrize("stopped", [True, False], ids=["another rank stopped the job", "nobody did"])
def test_the_echo_of_another_ranks_stop_ends_quietly_a_real_error_does_not(tmp_path, monkeypatch, capfd, stopped):
    """A rank that stops the job (a full disk, say) leaves its one line for the launcher and exits; a
    peer caught in a collective with it fails with gloo's "Connection closed by peer": without a
    traceback, which would bury the one line. Without that line the error is the rank's own: raised."""
    import multiprocessing

    monkeypatch.setenv(CONTROL_DIR_ENV, str(tmp_path))
    if stopped:
        (tmp_path / FAILED_MARKER).write_text("writing checkpoint step_10.pt failed (OSError: ...)\n1\n")
    worker = multiprocessing.get_context("fork").Process(target=failing_in_a_collective)
    worker.start()
    worker.join(30)
    said = capfd.readouterr().err
    assert worker.exitcode == (0 if stopped else 1)
    assert ("Traceback" in said and "Connection closed by peer" in said) != stopped, said
