"""engine/trainer.py: the Trainer in this process (a world of one, no process group): its loop's units,
what reaches the forward, a resume on two ranks, fit() and a stop signal; the step runner (mixed
precision, clipping, padding) and the grouping of micro-batches into optimizer steps. Its checkpoint state:
tests/engine/checkpoint/test_manager.py; the DDP wrapping: tests/engine/strategies/test_ddp.py."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.common.run_dir import FINISHED_MARKER, STOPPED_MARKER
from {{cookiecutter.package_name}}.config import DataConfig, TrainConfig, TrainerConfig, to_train_config
from {{cookiecutter.package_name}}.datasets.collate import pad_windows
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.distributed.process_group import weights_fingerprint
from {{cookiecutter.package_name}}.engine.preemption import StopOnSigterm
from {{cookiecutter.package_name}}.engine.strategies import Strategy
from {{cookiecutter.package_name}}.engine.trainer import StepRunner, optimizer_steps
from {{cookiecutter.package_name}}.tasks import IGNORE, Classification

from ..helpers import CPU, WIDEST, assert_same, compose_config, on_ranks, train_stop_resume, trainer
from .test_evaluate import PerPosition, TokenLoss


def test_each_epoch_trains_in_its_own_order(tmp_path: Path) -> None:
    """The classic forgotten `sampler.set_epoch`: without it every epoch repeats the first's order."""
    (tmp_path / "logs").mkdir()  # setup_logging makes it in a real run
    run = trainer(tmp_path, "trainer.record_samples=true", "data.batch_size=8", "data.train_size=64")
    stop = StopOnSigterm()
    try:
        for _ in range(2):
            run.train_epoch(stop)
            run.end_epoch()
    finally:
        stop.close()
    records = [json.loads(line) for line in (tmp_path / "logs" / "samples_rank_0.jsonl").read_text().splitlines()]
    orders = {epoch: [i for r in records if r["epoch"] == epoch for i in r["indices"]] for epoch in (0, 1)}
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(64)), "every sample once per epoch"
    assert orders[0] != orders[1]
    held = run.checkpoints.state_dict()  # what a checkpoint at the epoch's end holds: the next from its start
    assert (held["epoch"], held["samples_in_epoch"], held["step"]) == (2, 0, 16)


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", None)])
@pytest.mark.parametrize("channels_last", [True, False])
def test_precision_and_memory_layout_reach_the_forward(tmp_path: Path, precision, dtype, channels_last) -> None:
    run = trainer(tmp_path, f"trainer.precision={precision}", f"trainer.channels_last={channels_last}")
    seen = {}

    def look(module, args) -> None:
        seen["autocast"] = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        seen["inputs"] = args[0].is_contiguous(memory_format=torch.channels_last)

    run.model.register_forward_pre_hook(look)
    first = next(iter(run.data.train_loader))
    run.runner.micro_step(*first[:3], real_samples=len(first[0]), sync=True)
    conv = next(p for p in run.model.parameters() if p.dim() == 4)
    assert seen == {"autocast": dtype, "inputs": channels_last}
    assert conv.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_compile_wraps_the_model_that_trains_and_leaves_the_checkpointed_one_plain(tmp_path: Path) -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    compiled, plain = trainer(tmp_path / "a", "trainer.compile=true"), trainer(tmp_path / "b")
    assert isinstance(compiled.runner.trained, OptimizedModule)
    assert compiled.runner.trained._orig_mod is compiled.model
    assert not isinstance(plain.runner.trained, OptimizedModule)
    assert not any(key.startswith("_orig_mod.") for key in compiled.checkpoints.state_dict()["model"])


@pytest.mark.slow  # resnet50: 25M parameters, 15-35 s on 2 cores
@pytest.mark.parametrize(("model", "strategy", "features"), [("resnet50", "ddp", 2048), ("resnet18", WIDEST, 512)])
def test_the_shipped_resnets_train_and_resume_bit_exactly(
    tmp_path: Path, model: str, strategy: str, features: int
) -> None:
    """The shipped resnets (resnet50's 53 BatchNorm layers under ddp; resnet18 under helpers.py's WIDEST:
    sharded where the project has a sharding strategy), 16x16 images, on two ranks: a resumed run's weights
    and buffers are the uninterrupted run's, bit for bit, and training changed them. (A real SIGKILL:
    tests/e2e/test_resume.py (torchrun's restart), test_own_model.py, and each strategy's own e2e test.)"""
    job = [f"strategy={strategy}", f"model={model}", "data.image_size=16", "data.num_classes=4"]
    ends = on_ranks(2, train_stop_resume, tmp_path, job)[0]
    assert ends["uninterrupted_step"] == ends["resumed_step"] == 6
    assert_same(ends["resumed"], ends["uninterrupted"], f"{model}'s weights and buffers")
    assert int(ends["resumed"]["bn1.num_batches_tracked"]) == 6 and ends["resumed"]["fc.weight"].shape == (4, features)


def assert_resumed_on_two_ranks(ranks: list[dict]) -> None:
    ends = ranks[0]
    assert ends["uninterrupted_step"] == ends["resumed_step"] == 6
    assert_same(ends["resumed"], ends["uninterrupted"], "the resumed run's weights and buffers")


def test_a_model_with_buffers_resumes_bit_exactly_on_two_ranks(tmp_path: Path) -> None:
    """small_cnn's BatchNorm statistics under ddp: every rank holds rank 0's (ddp broadcasts them at the
    next forward), and a resume gives every rank rank 0's, not another's. A sharding strategy's (and its
    resume on another world size): its own tests, tests/engine/strategies/."""
    assert_resumed_on_two_ranks(on_ranks(2, train_stop_resume, tmp_path, ["strategy=ddp", "model=small_cnn"]))


def test_fit_trains_validates_and_checkpoints_every_epoch_then_says_it_has_finished(tmp_path: Path, caplog) -> None:
    caplog.set_level("INFO")
    run = trainer(tmp_path, "trainer.epochs=2", "checkpoint.every_n_steps=2", "checkpoint.keep_last=10")
    result = run.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    validations = [record for record in records if record["kind"] == "val"]
    assert [(r["epoch"], r["step"]) for r in validations] == [(0, 3), (1, 6)], "one validation per epoch, at its end"
    assert validations[-1]["val_loss"] == result.loss and result.samples == 16
    trains = [record for record in records if record["kind"] == "train"]
    assert trains and all(0 < record["train_loss"] < 10 for record in trains), "each log interval's mean loss"
    saved = sorted(path.name for path in (tmp_path / "checkpoints").glob("step_*.pt"))
    assert saved == ["step_00000002.pt", "step_00000003.pt", "step_00000004.pt", "step_00000006.pt"]
    assert (tmp_path / FINISHED_MARKER).read_text() == "6\n"
    again = trainer(tmp_path, "trainer.epochs=2", "checkpoint.every_n_steps=2", "checkpoint.keep_last=10")
    assert again.fit() == result and again.state.step == 6, "nothing trained again, the same evaluation"
    assert "training had already finished at step 6; evaluating" in caplog.text


def test_the_log_says_each_validation_between_epochs_the_early_stop_and_the_weights(tmp_path: Path, caplog) -> None:
    """3 steps an epoch, a validation every 2 steps and at each epoch's end; nothing improves by 100, so
    the third validation (step 4) stops the run. A relaunch says it had finished, and why."""
    caplog.set_level("INFO")
    recipe = ["trainer.epochs=5", "trainer.val_every_n_steps=2", "trainer.early_stop_patience=2",
              "trainer.early_stop_min_delta=100"]  # fmt: skip
    run = trainer(tmp_path, *recipe)
    run.fit()
    said = [record.getMessage() for record in caplog.records if record.name.endswith(".trainer")]
    between = [line for line in said if re.fullmatch(r"step \d+: val_loss=\S+ val_acc=\S+ val_macro_f1=\S+ "
                                                     r"val_samples=16 \(validated in \d+\.\d s\)", line)]  # fmt: skip
    assert [line.split(":")[0] for line in between] == ["step 2", "step 4"], "not step 3's: the epoch's end says it"
    assert all(float(re.findall(r"validated in (\S+) s", line)[0]) < 600 for line in between), "its own time"
    line_format = r"^epoch \d+ step \d+: train_loss=\S+ lr=\S+ grad_norm=\S+ (\d+) samples/s$"
    rates = [int(rate) for line in said for rate in re.findall(line_format, line)]
    assert rates and min(rates) >= 1, f"each interval's own rate: {said}"
    (epoch,) = [re.fullmatch(r"epoch 1/5 done in (\d+\.\d) s \((\d+) samples/s\): val_loss=\S+ val_acc=\S+ "
                             r"val_macro_f1=\S+ val_samples=16", line)
                for line in said if " done in " in line]  # fmt: skip
    seconds, rate, size = float(epoch[1]), int(epoch[2]), run.data.sampler.dataset_size  # printed to 0.1 s
    assert seconds < 600, "the epoch's own time: 3 small steps"
    assert size / (seconds + 0.05) - 1 <= rate <= (size / (seconds - 0.05) + 1 if seconds > 0.05 else 10**9), said
    assert not any("already finished" in line for line in said), "the run that stopped early returns its evaluation"
    stopped = "val_loss has not improved for 2 validations (patience 2; best "
    assert f"stopping early at step 4: {run.monitor.stopped}" in said and run.monitor.stopped.startswith(stopped)
    fingerprint = f"weights at step 4: sha256 {weights_fingerprint(run.strategy.full_weights())}"
    assert said[-1] == fingerprint
    caplog.clear()
    again = trainer(tmp_path, *recipe)
    assert again.fit().samples == 16
    said = [record.getMessage() for record in caplog.records if record.name.endswith(".trainer")]
    assert said == [f"training had already finished at step 4 (stopped early: {run.monitor.stopped}); evaluating",
                    fingerprint]  # fmt: skip


def test_a_run_that_reached_trainer_max_steps_has_finished_and_a_relaunch_trains_nothing(tmp_path, caplog) -> None:
    caplog.set_level("INFO")
    run = trainer(tmp_path, "trainer.epochs=5", "trainer.max_steps=4")  # 3 steps an epoch: one epoch and a step
    run.fit()
    again = trainer(tmp_path, "trainer.epochs=5", "trainer.max_steps=4")
    assert run.state.step == again.state.step == 4 and again.finished() and not run.monitor.stopped
    said = [record.getMessage() for record in caplog.records if record.name.endswith(".trainer")]
    assert [line.split(" done in ")[0] for line in said if " done in " in line] == ["epoch 1"], "no epoch count: steps"


def test_a_stop_signal_checkpoints_the_step_and_says_which_signal(tmp_path: Path) -> None:
    import os
    import signal

    from {{cookiecutter.package_name}}.common.errors import Preempted

    run = trainer(tmp_path, "trainer.epochs=2", "checkpoint.every_n_steps=0")
    step = run.train_step

    def step_then_signal(*args) -> None:  # SIGTERM arrives during the second step
        step(*args)
        if run.state.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    run.train_step = step_then_signal
    with pytest.raises(Preempted, match="stopped by SIGTERM after step 2; checkpoint saved") as stopped:
        run.fit()
    assert stopped.value.exit_code == 143 and (tmp_path / STOPPED_MARKER).read_text() == "15\n"
    assert [path.name for path in (tmp_path / "checkpoints").glob("step_*.pt")] == ["step_00000002.pt"]
    assert not (tmp_path / FINISHED_MARKER).exists()


def test_rank_zero_watched_at_a_terminal_draws_the_epochs_bar_with_its_loss(tmp_path: Path, monkeypatch) -> None:
    """The predicate is tested in tests/observe/test_logs.py; this, that the loop draws the bar it decides on."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    trainer(tmp_path, "trainer.epochs=1", "trainer.log_every_n_steps=2").fit()
    drawn = terminal.getvalue()
    # 96 samples in batches of 32; tqdm redraws at most every 0.1 s, so which counts show depends on the speed
    assert re.search(r"epoch 0: +\d+%.*? [0-3]/3 ", drawn), drawn[-500:]
    assert re.search(r"img_per_s=\d+, loss=\d+\.\d{4}, step=2\]", drawn), drawn[-500:]  # the log interval's


def test_a_warm_up_longer_than_the_run_is_said_at_the_start(tmp_path: Path, caplog) -> None:
    """trainer.max_steps=2 with a 5-step warm-up: the rate never reaches optim.lr, and the log says so first."""
    run = trainer(tmp_path, "trainer.max_steps=2", "scheduler.warmup_steps=5", "trainer.log_every_n_steps=1")
    caplog.set_level("INFO")
    run.fit()
    said = [(record.levelname, record.getMessage()) for record in caplog.records if record.name.endswith(".trainer")]
    assert said[0] == ("WARNING", "the warm-up (5 steps) is longer than the run (trainer.max_steps=2): the learning "
                       "rate ends at 0.4 of optim.lr and never reaches it; shorten scheduler.warmup_steps or "
                       "warmup_epochs, or train longer")  # fmt: skip
    rates = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if '"train"' in line]  # fmt: skip
    assert rates == pytest.approx([run.schedule.peaks[0] * step / 5 for step in (1, 2)])
    caplog.clear()
    trainer(tmp_path, "trainer.max_steps=2", "scheduler.warmup_steps=5").fit()
    assert not [record for record in caplog.records if record.levelname == "WARNING"], "finished: nothing to warn of"


@pytest.mark.parametrize("clip", [0.0, 0.01])
def test_the_gradient_norm_a_step_returns_is_clip_grad_norms_before_clipping(tmp_path: Path, clip: float) -> None:
    run = trainer(tmp_path, f"trainer.clip_grad_norm={clip}")
    inputs, targets, weights, _ = next(iter(run.data.train_loader))
    run.runner.micro_step(inputs, targets, weights, real_samples=len(inputs), sync=True)
    copies = [torch.zeros_like(p, requires_grad=True) for p in run.model.parameters()]
    for copy, parameter in zip(copies, run.model.parameters(), strict=True):
        copy.grad = parameter.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(copies, 0.01)
    assert torch.equal(run.runner.optimizer_step(), expected)
    assert expected > 0.01  # clipped where asked: the figure is the norm before


def test_the_log_line_holds_the_gradient_norm_and_peak_memory(tmp_path) -> None:
    """Without clipping too: the norm of every step, each read back only with its interval's line. (A task
    that counts tokens, and a model that says its FLOPs: tokens_per_s, their own tests.)"""
    norms = []
    run = trainer(tmp_path / "cnn", "trainer.max_steps=2", "trainer.log_every_n_steps=1")
    step = run.runner.optimizer_step
    run.runner.optimizer_step = lambda: norms.append(step()) or norms[-1]
    run.fit()
    records = [json.loads(line) for line in (tmp_path / "cnn" / "metrics.jsonl").read_text().splitlines()]
    train = [record for record in records if record["kind"] == "train"]
    assert [record["grad_norm"] for record in train] == [norm.item() for norm in norms]
    assert all(record["peak_memory_mb"] > 10 for record in train)
    assert "tokens_per_s" not in train[0] and "mfu" not in train[0]  # images; and no MFU on CPUs


@pytest.mark.slow  # two trainers' epochs on two ranks: in place of an end-to-end job pair (tests/e2e/test_step.py)
def test_bf16_accumulation_with_clipping_and_channels_last_resumes_bit_exactly_between_optimizer_steps(
    tmp_path: Path,
) -> None:
    """12 micro-batches a rank, 3 per optimizer step, bf16, clipped, channels_last, deterministic: 4 steps, a
    checkpoint after the third, and the resumed run's fourth step ends where the uninterrupted one does. (A
    real SIGKILL and torchrun's restart: tests/e2e/test_resume.py.)"""
    job = ["strategy=ddp", "model=small_cnn", "trainer.precision=bf16", "trainer.grad_accum_steps=3",
           "trainer.clip_grad_norm=1.0", "trainer.channels_last=true", "trainer.deterministic=true",
           "data.batch_size=4", "checkpoint.every_n_steps=3"]  # fmt: skip
    ends = on_ranks(2, train_stop_resume, tmp_path, job)[0]
    assert ends["uninterrupted_step"] == ends["resumed_step"] == 4, "12 micro-batches, 3 to a step"
    assert_same(ends["resumed"], ends["uninterrupted"], "the resumed run's weights and buffers")
    assert (tmp_path / "checkpoints" / "step_00000003.pt").is_file()


@pytest.mark.parametrize(("accum", "counts", "reals"), [(1, [1] * 4, [24, 24, 24, 8]), (3, [3, 1], [72, 8])])
def test_optimizer_steps_group_the_micro_batches_of_the_epoch(tmp_path: Path, accum, counts, reals) -> None:
    sampler = trainer(tmp_path, "data.train_size=80", "data.batch_size=24").data.sampler
    sampler.set_epoch(0)
    batches = iter(range(10))  # stands in for the loader: more than the epoch holds
    steps = list(optimizer_steps(batches, sampler, accum))
    assert [step.count for step in steps] == counts and [step.real_samples for step in steps] == reals
    assert next(batches) == 0, "lazy: nothing is read before its step is trained"


def linear_runner(clip: float, precision: str = "fp16", task: object = None) -> StepRunner:
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    config = TrainerConfig(
        epochs=1, log_every_n_steps=1, record_samples=False, precision=precision, channels_last=False, compile=False,
        grad_accum_steps=1, clip_grad_norm=clip,
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    plain = Strategy(to_train_config(compose_config()), CPU)  # the base strategy: no wrapper, no reduction
    return StepRunner(model, optimizer, config, torch.device("cpu"), 1, task or Classification(), plain)  # type: ignore[arg-type]


def test_a_non_finite_log_line_is_a_divergence_but_fp16s_skipped_gradients_are_not(tmp_path: Path) -> None:
    fp16, fp32 = trainer(tmp_path / "a", "trainer.precision=fp16"), trainer(tmp_path / "b")
    assert not fp16.diverged(1.0, math.inf) and not fp32.diverged(1.0, 2.0)
    assert fp32.diverged(1.0, math.inf) and fp32.diverged(math.nan, 1.0) and fp16.diverged(math.nan, 1.0)


def test_fp16_scales_the_loss_clips_unscaled_gradients_and_keeps_its_scale() -> None:
    runner = linear_runner(clip=1e-3)
    before = [p.detach().clone() for p in runner.trained.parameters()]
    loss = runner.micro_step(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]), torch.ones(4), 4, sync=True)
    runner.optimizer_step()
    after = list(runner.trained.parameters())
    moved = torch.stack([(a.detach() - b).norm() for a, b in zip(after, before, strict=True)]).norm()
    # SGD with lr 1 moves the weights by the clipped gradient: norm 1e-3 once unscaled (not 1e-3 / 65536).
    assert loss > 0 and moved == pytest.approx(1e-3, rel=0.05)
    state = runner.state_dict()["grad_scaler"]  # the runner's part of a checkpoint
    assert state["scale"] == 65536.0
    resumed = linear_runner(clip=1e-3)
    resumed.load_state_dict({"grad_scaler": {**state, "scale": 1024.0}})
    assert resumed.state_dict()["grad_scaler"]["scale"] == 1024.0


def test_an_fp16_run_resumed_from_a_checkpoint_without_a_scaler_keeps_its_own() -> None:
    resumed = linear_runner(clip=0.0)
    resumed.load_state_dict({"grad_scaler": {}})  # the checkpoint of an fp32 or bf16 run
    assert resumed.state_dict()["grad_scaler"]["scale"] == 65536.0


def test_clip_grad_norm_0_leaves_the_gradient_unclipped() -> None:
    runner = linear_runner(clip=0.0)
    before = [p.detach().clone() for p in runner.trained.parameters()]
    runner.micro_step(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]), torch.ones(4), 4, sync=True)
    runner.optimizer_step()
    moved = torch.stack([(a.detach() - b).norm() for a, b in zip(runner.trained.parameters(), before, strict=True)])
    assert moved.norm() > 1e-2, "trainer.clip_grad_norm=0 is off, not a clip to norm 0"


def test_padding_of_weight_0_adds_nothing_to_the_loss_or_the_gradient() -> None:
    runner = linear_runner(clip=0.0, precision="fp32")
    model = runner.trained
    inputs, targets = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    loss = runner.micro_step(inputs, targets, torch.tensor([1.0, 1.0, 0.0, 0.0]), real_samples=2, sync=True)
    padded = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = nn.functional.cross_entropy(model(inputs[:2]), targets[:2])  # the 2 real samples' mean
    expected.backward()
    assert torch.allclose(loss, expected.detach())
    assert all(torch.allclose(a, p.grad) for a, p in zip(padded, model.parameters(), strict=True))


class SummedCrossEntropy(Classification):
    """Classification's loss as a (total, count) pair."""

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        return super().loss(logits, labels).sum(), len(labels)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_total_and_count_loss_steps_as_the_mean_also_when_fp16_scales_it(precision: str) -> None:
    """The pair's gradient is rescaled after fp16's unscale: the step equals the per-sample mean's."""
    inputs, targets = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0, 1, 1])
    moved = {}
    for name, task in (("mean", Classification()), ("pair", SummedCrossEntropy())):
        runner = linear_runner(clip=0.0, precision=precision if name == "pair" else "fp32", task=task)
        if runner.scaler.is_enabled():  # a scale the summed (not averaged) gradients fit in fp16 (docs/tasks.md)
            runner.load_state_dict({"grad_scaler": {**runner.scaler.state_dict(), "scale": 1024.0}})
        before = [p.detach().clone() for p in runner.trained.parameters()]
        for half in (slice(0, 4), slice(4, 6)):  # two micro-batches of 4 and 2 samples
            runner.micro_step(inputs[half], targets[half], torch.ones(6)[half], 6, sync=half.start == 4)
        assert (runner.items is not None) == (name == "pair")
        runner.optimizer_step()
        assert runner.items is None
        moved[name] = [b - a.detach() for b, a in zip(before, runner.trained.parameters(), strict=True)]
    tolerance = {"rtol": 1e-5, "atol": 1e-7} if precision == "fp32" else {"rtol": 1e-2, "atol": 1e-3}
    for pair, mean in zip(moved["pair"], moved["mean"], strict=True):
        torch.testing.assert_close(pair, mean, **tolerance)


def token_config(overrides: list[str], dataset: str, batch_size: int) -> TrainConfig:
    """A per-position model and a (total, count) task (tests/engine/test_evaluate.py's: a sequence model's
    kind of loss, without one) on windows of this module's `dataset`, batched through pad_windows."""
    config = to_train_config(compose_config(overrides))
    config.model = {"_target_": f"{PerPosition.__module__}.PerPosition"}
    config.task = {"_target_": f"{TokenLoss.__module__}.TokenLoss"}
    config.data = DataConfig.from_node({"batch_size": batch_size, "dataset": {"_target_": f"{__name__}.{dataset}"},
                                        "collate": {"_target_": f"{pad_windows.__module__}.pad_windows"}})  # fmt: skip
    return config


def even_windows() -> tuple[list, list]:
    """Windows of 8 tokens, next-token targets: 16 to train on, 4 to validate on."""

    def window(first: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.arange(first, first + 9) % 16
        return tokens[:-1], tokens[1:]

    return [window(i) for i in range(16)], [window(30 + i) for i in range(4)]


def half_masked_windows() -> tuple[list, list]:
    """Windows of 8 tokens: 4 to train on, the odd two with every target masked (IGNORE, as pad_windows
    pads); 3 to validate on, all masked."""

    def window(first: int, masked: bool) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.arange(first, first + 9) % 16
        return tokens[:-1], torch.full((8,), IGNORE) if masked else tokens[1:]

    return [window(i, i % 2 == 1) for i in range(4)], [window(30 + i, True) for i in range(3)]


def test_a_log_line_over_two_steps_says_their_totals_over_their_items_together(tmp_path) -> None:
    """A (total, count) loss's train_loss over a log interval is all its steps' totals over all their items:
    with windows of one length (as many items each step), the mean of the same run's lines logged every step.
    (Each step's items only, as a sampled mutant had it, said twice the loss: docs/layout.md.)"""
    losses = {}
    for every in (1, 2):
        overrides = ["trainer.max_steps=4", f"trainer.log_every_n_steps={every}"]
        build_trainer(token_config(overrides, "even_windows", 4), CPU, tmp_path / str(every)).fit()
        records = [json.loads(line) for line in (tmp_path / str(every) / "metrics.jsonl").read_text().splitlines()]
        losses[every] = [record["train_loss"] for record in records if record["kind"] == "train"]
    assert len(losses[1]) == 4 and len(losses[2]) == 2, losses
    for first, second, joined in zip(losses[1][::2], losses[1][1::2], losses[2], strict=True):
        assert joined == pytest.approx((first + second) / 2, rel=1e-6), losses


def test_a_total_and_count_loss_that_counted_nothing_is_nan_said_why_counted_and_never_best(tmp_path, caplog) -> None:
    """Before: a log line of only empty steps said train_loss=0.0, a validation of no items val_loss=0.000000,
    and that validation was ranked best. Now: NaN, a line that says why (not a divergence), the empty steps
    counted in metrics.jsonl, no validation ranked best or counted as an improvement."""
    caplog.set_level("INFO")
    overrides = ["trainer.max_steps=4", "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=2",
                 "checkpoint.keep_best=1", "trainer.early_stop_patience=3"]  # fmt: skip
    run = build_trainer(token_config(overrides, "half_masked_windows", 1), CPU, tmp_path)
    run.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [record for record in records if record["kind"] == "train"]
    assert sorted(record["empty_steps"] for record in train) == [0, 0, 1, 1], "one window a step, in any order"
    for record in train:
        assert (record["train_loss"] == "NaN") == (record["empty_steps"] == 1), record
        assert record["train_loss"] == "NaN" or record["train_loss"] > 0, record
    assert [(record["step"], record["val_loss"]) for record in records if record["kind"] == "val"] == [
        (2, "NaN"), (4, "NaN")]  # fmt: skip
    assert run.monitor.best == [] and run.monitor.bad == 2 and not run.monitor.stopped
    assert json.loads((tmp_path / "checkpoints" / "best.json").read_text())["best"] == [], "no checkpoint kept as best"
    said = caplog.text
    assert said.count("train_loss is NaN: the 1 step since the last log line counted no items (every target "
                      "masked?) and took no gradient") == 2  # fmt: skip
    assert len(re.findall(r"step \d: train_loss=nan .* samples/s empty_steps=1$", said, re.MULTILINE)) == 2, said
    assert said.count("val_loss is NaN: the validation counted no items") == 2
    assert "diverged" not in said
