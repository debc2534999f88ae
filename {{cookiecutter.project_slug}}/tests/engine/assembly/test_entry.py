"""engine/assembly/entry.py, what a worker fixes up before training: the legacy launcher's argument (the checks it
runs as it starts: tests/engine/assembly/test_checks.py); one build path from the checks to the first step; a refusal
under the launcher, told to it and to the other nodes; the error file torchrun's agent reads of a failed worker."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from {{cookiecutter.package_name}} import train as train_entry
from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.run_dir import CONTROL_DIR_ENV, FAILED_MARKER, REFUSED
from {{cookiecutter.package_name}}.engine.assembly import entry
from {{cookiecutter.package_name}}.engine.assembly.entry import accept_legacy_local_rank, record, refuse, reporting_user_errors
from {{cookiecutter.package_name}}.engine.checkpoint import writer
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


def cut_short(data, out, **_) -> None:
    """json.dump as the agent's SIGTERM leaves it (it kills a rank outside training, its handler gone)."""
    out.write(json.dumps(data)[:20])
    out.flush()
    os.kill(os.getpid(), signal.SIGTERM)


def failing_worker(killed_while_writing: bool) -> None:
    """A worker whose bug reaches @record, killed in the middle of its error file's write or not."""
    if killed_while_writing:
        json.dump = cut_short

    @record
    def main() -> None:
        raise RuntimeError("bug in the model on rank 1")

    main()


@pytest.mark.parametrize("killed_while_writing", [False, True], ids=["whole", "killed while writing it"])
def test_the_agent_reads_a_failed_workers_error_file_whole_or_not_at_all(tmp_path, killed_while_writing) -> None:
    """torchrun's agent reads every failed worker's error file, the ones it SIGTERMed after the first
    failure too: one cut short by the signal crashed it (JSONDecodeError) instead of naming the rank."""
    import multiprocessing

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "error.json"
    os.environ["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    worker = multiprocessing.get_context("fork").Process(target=failing_worker, args=(killed_while_writing,))
    worker.start()
    worker.join(30)
    failure = ProcessFailure(local_rank=1, pid=worker.pid, exitcode=worker.exitcode, error_file=str(error_file))
    if killed_while_writing:
        assert worker.exitcode == -signal.SIGTERM and not error_file.exists()
        assert "SIGTERM" in failure.message
    else:
        assert worker.exitcode == 1
        assert failure.message["message"] == "RuntimeError: bug in the model on rank 1"
        assert 'raise RuntimeError("bug in the model' in failure.message["extraInfo"]["py_callstack"]


BUILT: Counter = Counter()  # what the process built, by kind
INITIAL: list[torch.Tensor] = []  # each model's initial weights


class CountedModel(nn.Sequential):
    def __init__(self, **_: object) -> None:  # the default model's keys, unused
        BUILT["model"] += 1
        super().__init__(nn.Flatten(), nn.Linear(12, 3))
        INITIAL.append(self[1].weight.detach().clone())


def counted_pair(**_: object) -> tuple[TensorDataset, TensorDataset]:  # the default data set's keys, unused
    BUILT["datasets"] += 1
    generator = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(20, 12, generator=generator), torch.randint(0, 3, (20,), generator=generator)
    return TensorDataset(inputs[:16], labels[:16]), TensorDataset(inputs[16:], labels[16:])


def test_a_process_builds_its_model_once_and_reads_the_checkpoint_it_resumes_from_once(
    in_process, monkeypatch, tmp_path: Path
) -> None:
    """What the start's checks build (the model, the task; one batch through them) and read (the checkpoint
    to resume from) is what trains: neither is built or read twice. The data sets are built again for the
    loaders, on purpose: the check read items of its own (a first read may open what forked DataLoader
    workers cannot use)."""
    reads: list[Path] = []

    def read(path: Path, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        reads.append(path)
        return load(path, *args, **kwargs)

    load = writer.load_checkpoint
    monkeypatch.setattr(writer, "load_checkpoint", read)
    job = ["train.py", f"model._target_={__name__}.CountedModel", f"data.dataset._target_={__name__}.counted_pair",
           "task=classification", "data.batch_size=4", f"hydra.run.dir={tmp_path}"]  # fmt: skip
    torch.manual_seed(123)  # whatever the process drew before: the model's weights come from the config's seed
    for epochs in (1, 2):  # a new run, then the same run dir resumed for one more epoch
        BUILT.clear()
        monkeypatch.setattr(sys, "argv", [*job, f"trainer.epochs={epochs}"])
        train_entry.main()
        assert BUILT == {"model": 1, "datasets": 2}, f"built at trainer.epochs={epochs}: {dict(BUILT)}"
    assert in_process == [0, 0]
    assert reads == [tmp_path / "checkpoints" / "step_00000004.pt"], "the resume read its checkpoint once"
    torch.manual_seed(0)  # seed: 0, configs/train.yaml's: the checked model is the one every rank builds
    expected = nn.Linear(12, 3).weight.detach()
    assert all(torch.equal(weights, expected) for weights in INITIAL[-2:]), "the weights come from the seed"


def test_a_worker_before_the_trainers_handlers_is_ended_by_sigint_as_by_sigterm(monkeypatch) -> None:
    """Under torchrun, a Ctrl-C passed on to a worker before the trainer's handlers (engine/preemption.py) ends it
    at once, as SIGTERM does, not as a KeyboardInterrupt's traceback amid the config's composition or the build
    (the launcher says in one line that nothing was trained: tests/launch/test_supervise.py)."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a job")
    monkeypatch.setattr(entry, "die_with_parent", lambda: None)  # not this test process
    previous = signal.getsignal(signal.SIGINT)
    try:
        entry.prepare(["train.py"])
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)
