"""comm_check.py: every collective the training relies on, verified, with a PASS/FAIL table."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from {{cookiecutter.package_name}} import comm_check
from {{cookiecutter.package_name}}.common.placement import DistEnv

from .helpers import on_ranks

CHECK_NAMES = ["all_reduce", "broadcast", "all_gather", "barrier", "new_group"]


@pytest.fixture(autouse=True)
def alone(monkeypatch) -> None:
    """A process of its own, not a worker of a torchrun job (whatever the environment says)."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def verdicts(output: str) -> dict[str, str]:
    return dict(re.findall(r"^(\w+)\s+(PASS|FAIL)\b", output, re.MULTILINE))


def test_a_world_of_one_passes_every_check_and_prints_the_table(capsys) -> None:
    assert comm_check.main(["dist.backend=gloo"]) == 0
    output = capsys.readouterr().out
    assert "world size 1, backend gloo" in output
    assert verdicts(output) == {**dict.fromkeys(CHECK_NAMES, "PASS"), "overall": "PASS"}
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", output, re.MULTILINE)
    assert [int(size) for size, *_ in rows] == comm_check.SIZES_BYTES
    assert all(float(busbw) == 0 for *_, busbw in rows), "busbw = algbw * 2(n-1)/n: nothing crosses a link at n=1"
    assert re.search(r"^\s+0\s+\S+\s+0\s+\S+\s+gloo$", output, re.MULTILINE), "where rank 0 runs"


def test_a_failing_check_is_reported_in_the_table_and_the_others_still_run(capsys, monkeypatch) -> None:
    def broken(env: DistEnv) -> str:
        raise AssertionError("sum 3.0 != 4.0\nand a long story after it")

    monkeypatch.setattr(comm_check, "CHECKS", [("broken", broken), *comm_check.CHECKS])
    assert comm_check.main(["dist.backend=gloo"]) == 1
    output = capsys.readouterr().out
    assert verdicts(output) == {"broken": "FAIL", **dict.fromkeys(CHECK_NAMES, "PASS"), "overall": "FAIL"}
    assert re.search(r"^broken\s+FAIL\s+sum 3.0 != 4.0$", output, re.MULTILINE), "the first line of the reason"


@pytest.mark.parametrize(
    ("override", "message"),
    [("dist.backend=carrier_pigeon", "dist.backend"), ("dist.timeout_s=0", "dist.timeout_s")],
)
def test_a_config_error_is_one_line_and_exit_code_2(capsys, override: str, message: str) -> None:
    assert comm_check.main([override]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and message in err and err.count("\n") == 1, err


def checks_on_rank(env: DistEnv) -> tuple[bool, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        passed = comm_check.run_checks(env)
    return passed, printed.getvalue()


def test_two_ranks_pass_every_check_and_rank_zero_alone_prints_the_table() -> None:
    (passed_0, output), (passed_1, other) = on_ranks(2, checks_on_rank)
    assert passed_0 and passed_1
    assert other == "", "one table, on rank 0"
    assert "world size 2, backend gloo" in output
    assert verdicts(output) == {**dict.fromkeys(CHECK_NAMES, "PASS"), "overall": "PASS"}
    assert re.search(r"^all_reduce\s+PASS\s+sum of 1..2 = 3$", output, re.MULTILINE)
    assert re.search(r"^all_gather\s+PASS\s+2 ranks in order$", output, re.MULTILINE)
    assert len(re.findall(r"^\s+[01]\s+\S+\s+[01]\s+cpu\s+gloo$", output, re.MULTILINE)) == 2, "where each rank runs"
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", output, re.MULTILINE)
    size, _, algbw, busbw = rows[-1]
    assert float(busbw) == pytest.approx(float(algbw), abs=2e-3), "busbw = algbw * 2(n-1)/n = algbw at n=2"
    assert float(busbw) > 0


def subgroup_and_bandwidth(env: DistEnv) -> tuple[str, tuple[float, float, float]]:
    return comm_check.check_subgroup(env), comm_check.bus_bandwidth(env, 4096, 2)


def test_four_ranks_reduce_in_a_true_subgroup_and_report_busbw_as_nccl_tests_does() -> None:
    """Below 4 ranks the subgroup is every rank: 4 show a reduce over the default group would be caught (its
    sum, 4, is not the subgroup's 2); busbw = algbw * 2(n-1)/n, here 1.5."""
    for said, (micros, algbw, busbw) in on_ranks(4, subgroup_and_bandwidth):
        assert said == "all_reduce in new_group(ranks=[0, 2])"
        assert micros > 0 and busbw == pytest.approx(algbw * 1.5)
