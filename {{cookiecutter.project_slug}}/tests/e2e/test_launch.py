"""The launch scripts and the launcher as users run them: errors, pass-through, GPUs, installs."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch.job import lock_run_dir
from {{cookiecutter.package_name}}.launch.keys import LaunchError, parse_args
from {{cookiecutter.package_name}}.launch.plan import plan
from {{cookiecutter.package_name}}.launch.supervise import Forwarder, torchrun

from ..helpers import MODEL_CHOICES, PROJECT_DIR, PYTHON, SMALL, run
from .jobs import last_line, project_copy


# The one quick test of the two scripts themselves: each hands its mode and arguments to the launcher (a mode's
# script: in its tests/launch/modes/ file).
def test_script_errors_are_one_line_without_traceback() -> None:
    for script, argv in (("run_single.sh", ["data=synthetic", "data.batch_size=0"]), ("run_multi.sh", ["NODE_RANK=x"])):
        proc = run(["bash", f"scripts/{script}", *argv], expect_ok=False, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (script, proc.stderr)
        assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stdout + proc.stderr


# Quick although it starts torchrun (one process, a probe that imports nothing heavy): GPUS= must reach
# the workers through the launcher's own path, plan() then torchrun(), and nothing in-process sees that.
def test_gpus_key_gives_one_process_per_gpu_and_reaches_it_as_cuda_visible_devices(monkeypatch, capfd) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # what the shell had: GPUS= must win over it
    monkeypatch.chdir(PROJECT_DIR)  # the probe runs as the module tests.e2e.worker_env_probe
    launch = plan("single", parse_args(["GPUS=3"], "single"), dict(os.environ), {})
    forwarder = Forwarder()
    try:
        code = torchrun(launch, "tests.e2e.worker_env_probe", [], forwarder)
    finally:
        forwarder.close()
    output = capfd.readouterr()
    assert code == 0, output.out + output.err[-3000:]
    seen = [json.loads(line) for line in output.out.splitlines() if line.startswith("{")]
    assert seen == [{"RANK": "0", "WORLD_SIZE": "1", "CUDA_VISIBLE_DEVICES": "3"}], output.out


# A worker forked from the agent (launch/forked.py) has what a new interpreter would have had.
@pytest.mark.slow
def test_a_forked_worker_has_what_a_new_interpreter_would(monkeypatch, capfd) -> None:
    monkeypatch.chdir(PROJECT_DIR)  # the probe runs as the module tests.e2e.worker_start_probe
    monkeypatch.setenv("PROBE_EXIT_CODE", "3")  # and its exit code reaches torchrun's summary
    seen = {}
    for start in ("exec", "fork"):
        monkeypatch.setenv("WORKER_START", start)
        launch = plan("single", parse_args(["NPROC_PER_NODE=2", "MAX_RESTARTS=0"], "single"), dict(os.environ), {})
        forwarder = Forwarder()
        try:
            code = torchrun(launch, "tests.e2e.worker_start_probe", ["a=1", "b c"], forwarder)
        finally:
            forwarder.close()
        output = capfd.readouterr()
        assert code == 1 and "exitcode  : 3" in output.err, output.out + output.err[-3000:]
        seen[start] = sorted(output.out.splitlines(), key=lambda line: json.loads(line)["rank"])
    assert seen["fork"] == seen["exec"]
    assert json.loads(seen["fork"][0]) == {
        "argv": ["worker_start_probe.py", "a=1", "b c"], "name": "__main__", "session_leader": True,
        "open_fds": [0, 1, 2, 3], "handlers": {"SIGTERM": "SIG_DFL", "SIGHUP": "SIG_DFL",
        "SIGINT": "<built-in function default_int_handler>"}, "threads": 1, "rank": "0", "unbuffered": True,
    }  # fmt: skip


@pytest.fixture(scope="module")
def quiet_project(tmp_path_factory) -> Path:
    """A project copy no other test launches in: its outputs/ changes only by what the test under way does
    (in the shared project, a job beside it under xdist adds its own run dir at any moment)."""
    return project_copy(tmp_path_factory.mktemp("rejected") / "project")


# Several seconds each to start the launcher, which refuses before torchrun: in the slow set, as
# tests/launch/ and tests/config/ check the same refusals in-process.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [  # one of each kind, through the script; tests/launch/ checks every case in-process
        (["data=synthetic", "data.batch_size=0"], "data.batch_size must be a whole number >= 1, got 0"),
        (["NPROC_PER_NODE=two"], "NPROC_PER_NODE=two is not a whole number"),
        (["model=vgg11"], f"Could not find 'model/vgg11'; choose one of: {MODEL_CHOICES}"),
        (["data=image_folder", "data.root=/nonexistent"], "image_folder: /nonexistent/train does not exist"),
    ],
)
def test_launch_script_rejects_bad_input_before_torchrun(args: list[str], message: str, quiet_project: Path) -> None:
    proc = run(["bash", "scripts/run_single.sh", *args], cwd=quiet_project, expect_ok=False, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1, "one line that says what is wrong and what to do"
    assert "Traceback" not in proc.stderr and "torch.distributed" not in proc.stdout
    assert not list((quiet_project / "outputs").glob("*")), "a rejected launch must not create a run dir"


@pytest.mark.slow
def test_hydra_flags_pass_through_the_script() -> None:
    proc = run(["bash", "scripts/run_single.sh", "--cfg", "job", "model=resnet18"])
    assert "_target_: torchvision.models.resnet18" in proc.stdout
    helped = run(["bash", "scripts/run_single.sh", "--help"])
    assert "NPROC_PER_NODE" in helped.stdout and "Powered by Hydra" in helped.stdout


@pytest.mark.slow
def test_a_second_launch_on_a_run_dir_in_use_is_refused_naming_the_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = lock_run_dir(run_dir)  # this test process plays the first job
    try:
        with pytest.raises(LaunchError, match=r"run dir .*run is in use by \S+ pid \d+ since 20"):
            lock_run_dir(run_dir)
        proc = run(["bash", "scripts/run_single.sh", f"RUN_DIR={run_dir}", *SMALL], expect_ok=False, timeout=120)
        assert proc.returncode == 2 and f"is in use by {socket.gethostname()} pid" in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and not (run_dir / "logs").exists(), "nothing of the second job ran"
    finally:
        os.close(holder)
    os.close(lock_run_dir(run_dir))  # released with its holder: never stale


JOB = [*SMALL, "trainer.epochs=1", "data.train_size=128", "data.val_size=50"]


@pytest.mark.slow
def test_the_ci_workflows_job_runs_and_torchrun_flags_pass_through_the_script(tmp_path: Path) -> None:
    """The generated CI's one torchrun job, as its workflow writes it (in a run dir of this test's), with
    torchrun's own flags after `--`."""
    import shlex

    import yaml

    steps = yaml.safe_load((PROJECT_DIR / ".github" / "workflows" / "ci.yml").read_text())["jobs"]["lint-and-test"]
    command = shlex.split(next(step["run"] for step in steps["steps"] if "run_single.sh" in step.get("run", "")))
    command = [f"RUN_DIR={tmp_path / 'run'}" if item.startswith("RUN_DIR=") else item for item in command]
    proc = run([*command, "--", f"--log-dir={tmp_path / 'torchrun_logs'}", "--redirects=3", "--local-ranks-filter=0"])
    logs = list((tmp_path / "torchrun_logs").rglob("stdout.log"))
    assert len(logs) == 2, "torchrun wrote each rank's output where --log-dir said"
    assert '"val_loss": ' in proc.stdout + proc.stderr and (tmp_path / "run" / "checkpoints").is_dir()  # any task


@pytest.mark.slow
def test_a_real_bug_is_named_by_rank_with_its_traceback(tmp_path: Path) -> None:
    project = project_copy(tmp_path / "project")
    (project / "buggy.py").write_text(
        "import os\nfrom torch import nn\n\n\nclass Buggy(nn.Linear):\n"
        "    def forward(self, x):\n        if os.environ.get('RANK') == '1' and not self.training:\n"
        "            raise RuntimeError('bug in the model on rank 1')\n        return super().forward(x.flatten(1))\n"
    )
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", "MAX_RESTARTS=0", f"RUN_DIR={tmp_path / 'run'}",
                *JOB, "model._target_=buggy.Buggy", "+model.in_features=768", "+model.out_features=10",
                "~model.width", "~model.num_classes"], cwd=project, expect_ok=False)  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert re.search(r"rank\s*:\s*1 ", output) and "RuntimeError: bug in the model on rank 1" in output, output[-3000:]
    assert 'raise RuntimeError("bug' in output or "raise RuntimeError('bug" in output, "the traceback, not only a line"

    # A callback that raises on one rank only: the job ends (the other rank is not left waiting in its next
    # collective), with the one line that names the callback, and no traceback of it.
    (project / "on_one_rank.py").write_text(
        "class Fails:\n    def on_step_end(self, run):\n        if run.rank == 1 and run.step == 2:\n"
        "            raise ValueError('rank 1 cannot take step 2')\n"
    )
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", "MAX_RESTARTS=0", f"RUN_DIR={tmp_path / 'cb'}",
                *JOB, "+callbacks.fails._target_=on_one_rank.Fails"], cwd=project, expect_ok=False)  # fmt: skip
    output = proc.stdout + proc.stderr
    line = "callbacks.fails.on_step_end raised ValueError: rank 1 cannot take step 2: fix it or remove it"
    assert proc.returncode != 0 and line in output, output[-3000:]
    assert "raise ValueError" not in output, "one line, not the callback's traceback"


@pytest.mark.slow
def test_pip_install_gives_a_working_package_with_its_configs(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(PROJECT_DIR)], check=True, capture_output=True)  # fmt: skip
    package = "{{cookiecutter.package_name}}"
    assert (target / package / "configs" / "model" / "small_cnn.yaml").is_file()
    source = PROJECT_DIR / package  # every module installed: a package left out of the list goes unseen elsewhere
    missing = [str(path.relative_to(source)) for path in source.rglob("*.py")
               if not (target / package / path.relative_to(source)).is_file()]  # fmt: skip
    assert not missing, f"not installed (pyproject.toml's [tool.setuptools] packages): {missing}"
    elsewhere = tmp_path / "elsewhere"  # not the project: only the installed package can be found
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(target)}
    shown = run([str(target / "bin" / f"{package}-train"), "--cfg", "job"], cwd=elsewhere, env=env)
    assert "_target_:" in shown.stdout
    # No run dir given: torchrun's agent's run id names one for the job, the same on both ranks (as under
    # torch.distributed.launch, whose --local-rank argument tests/test_train.py passes in-process).
    trained = run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                   f"{package}.train", *JOB], cwd=elsewhere, env=env)  # fmt: skip
    assert "final: val_loss=" in last_line(trained.stderr)
    run_dirs = list((elsewhere / "outputs").iterdir())
    assert len(run_dirs) == 1 and run_dirs[0].name.startswith("torchrun_"), run_dirs
    assert {path.name for path in (run_dirs[0] / "logs").iterdir()} == {"rank_0.log", "rank_1.log"}
    assert sys.modules[package].__file__.startswith(str(PROJECT_DIR)), "the tests themselves use the source tree"
