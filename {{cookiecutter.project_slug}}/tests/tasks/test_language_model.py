"""tasks/language_model.py: the language model's loss (a (total, count) pair over the real tokens), its
bits per byte, its predictions."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch
import torch.nn.functional as F

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.datasets import pad_windows
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.assembly.components import build_model
from {{cookiecutter.package_name}}.engine.checkpoint.files import load_checkpoint
from {{cookiecutter.package_name}}.engine.evaluate import EvalResult, evaluate
from {{cookiecutter.package_name}}.models import GPT
from {{cookiecutter.package_name}}.observe.figures import Throughput
from {{cookiecutter.package_name}}.tasks import Task
from {{cookiecutter.package_name}}.tasks.language_model import LanguageModel

from .. import test_predict
from ..engine.test_evaluate import window_data, windows
from ..helpers import compose_config, cpu_env, on_ranks
from ..test_predict import predict

in_process_predict = test_predict.in_process_predict  # the fixture: predict.py's main() run in this process


def test_the_language_model_loss_is_the_next_token_cross_entropy_summed_over_the_real_tokens_and_their_count() -> None:
    generator = torch.Generator().manual_seed(1)
    logits, tokens = torch.randn(3, 7, 11, generator=generator), torch.randint(0, 11, (3, 7), generator=generator)
    total, count = LanguageModel().loss(logits, tokens)
    assert total.shape == () and count == 21
    expected = F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="sum")
    assert total.item() == pytest.approx(expected.item())
    tokens[2, 3:] = -100  # padding (pad_windows): neither scored nor counted
    total, count = LanguageModel().loss(logits, tokens)
    real = tokens != -100
    expected = F.cross_entropy(logits[real], tokens[real], reduction="sum")
    assert count == 17 and total.item() == pytest.approx(expected.item())


def test_the_language_models_bits_per_byte_are_its_loss_in_bits() -> None:
    generator = torch.Generator().manual_seed(2)
    logits, tokens = torch.randn(4, 5, 256, generator=generator), torch.randint(0, 256, (4, 5), generator=generator)
    metrics = LanguageModel().metrics(logits, tokens)
    assert list(metrics) == ["loss", "bpb"]
    total, count = metrics["loss"]
    torch.testing.assert_close(total.float(), LanguageModel().loss(logits, tokens)[0])
    assert count == 20
    torch.testing.assert_close(metrics["bpb"][0], total / math.log(2), rtol=0, atol=0)
    assert metrics["bpb"][1] == count
    uniform, count = LanguageModel().metrics(torch.zeros(1, 5, 256), tokens[:1])["bpb"]
    assert (uniform / count).item() == pytest.approx(8.0), "a uniform guess over 256 bytes costs 8 bits a byte"


def test_the_language_model_is_a_task_whose_half_precision_loss_is_computed_in_float32() -> None:
    assert isinstance(LanguageModel(), Task)
    generator = torch.Generator().manual_seed(0)
    logits, tokens = torch.randn(2, 3, 5, generator=generator), torch.randint(0, 5, (2, 3), generator=generator)
    for dtype in (torch.float16, torch.bfloat16):
        half = logits.to(dtype)
        (total, count), (expected, _) = LanguageModel().loss(half, tokens), LanguageModel().loss(half.float(), tokens)
        assert total.dtype == torch.float32 and torch.equal(total, expected) and count == 6


def test_the_language_models_predictions_are_its_logits_their_softmax_or_the_likeliest_token() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    task = LanguageModel()
    assert task.predictions == ("logits", "probs", "token")  # the first: predict.py's default
    assert task.predict(logits, "logits") is logits
    assert torch.equal(task.predict(logits, "probs"), torch.softmax(logits, dim=-1))
    assert torch.equal(task.predict(logits, "token"), logits.argmax(dim=-1))


def test_the_log_lines_tokens_per_s_and_mfu_count_the_windows_tokens_and_the_gpts_flops() -> None:
    lm, cpus = Throughput(), types.SimpleNamespace(device=torch.device("cpu"), world_size=2)
    lm.count_tokens(LanguageModel(), torch.zeros(4, 16, dtype=torch.long), GPT(block_size=16, width=32, layers=2))
    figures = lm.figures(10.0, cpus)
    assert figures["tokens_per_s"] == 160.0 and "mfu" not in figures  # no peak FLOPs known on a CPU
    lm.peak = 1e12  # a GPU the table knows
    assert lm.figures(10.0, cpus)["mfu"] == pytest.approx(160.0 * lm.flops_per_token / (2 * 1e12))


# predict.py on windows of different lengths (data.collate=pad_windows)


RAGGED = ["task=language_model", "data=text", f"data.dataset._target_={__name__}.ragged", "data.batch_size=4",
          f"+data.collate._target_={pad_windows.__module__}.pad_windows", "data.block_size=16", "model.layers=1",
          "model.width=16", "model.heads=2", "trainer.epochs=1"]  # fmt: skip


def ragged(**_: object) -> tuple[list, list]:
    """(train, val): byte windows of 2 to 16 bytes, next-byte targets; batched by 4, of different lengths."""
    text = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 20))
    lengths = [2, 16, 5, 9, 3, 4, 7, 6, 12, 2, 8]
    windows = [(text[start : start + n], text[start + 1 : start + n + 1]) for start, n in enumerate(lengths)]
    return windows, windows


def test_windows_of_different_lengths_are_padded_and_their_lengths_saved(
    in_process_predict, tmp_path, monkeypatch, capsys
) -> None:
    """data.collate=pad_windows: each window's tokens up to its length, IGNORE (-100) past it."""
    build_trainer(to_train_config(compose_config(RAGGED)), cpu_env(0, 1), tmp_path / "run").fit()
    checkpoint = next((tmp_path / "run" / "checkpoints").glob("step_*.pt"))
    out = tmp_path / "tokens.pt"
    predict(monkeypatch, capsys, f"ckpt_path={checkpoint}", f"out={out}", "predict_as=token", "trust_checkpoint=true")
    written = torch.load(out, weights_only=True)
    windows = ragged()[1]
    assert set(written) == {"indices", "outputs", "lengths"} and written["outputs"].shape == (11, 16)
    assert written["lengths"].tolist() == [len(window) for window, _ in windows]
    payload = load_checkpoint(checkpoint)
    model = build_model(payload["config"]["model"])
    model.load_state_dict(payload["model"])
    with torch.no_grad():  # as one process batches them: 4 windows padded to the batch's longest
        tokens = [model.eval()(pad_windows(windows[start : start + 4])[0]).argmax(-1) for start in range(0, 11, 4)]
    for index, (window, _) in enumerate(windows):
        row, length = written["outputs"][index], len(window)
        assert torch.equal(row[:length], tokens[index // 4][index % 4, :length])
        assert (row[length:] == -100).all()


def test_a_checkpoint_may_build_the_gpt_and_the_task_by_their_names_and_their_homes() -> None:
    from {{cookiecutter.package_name}}.engine.checkpoint.trust import trusted

    package = LanguageModel.__module__.split(".")[0]
    for target in (f"{package}.models.GPT", f"{package}.models.gpt.GPT", f"{package}.tasks.LanguageModel",
                   f"{package}.tasks.language_model.LanguageModel"):  # fmt: skip  # old names and new homes
        assert trusted(target), target


# Evaluation: val_loss and val_bpb over every token of the set, at any world size (the token-weighted figures of
# any task: tests/engine/test_evaluate.py, whose windows these are)


def evaluate_gpt_windows(env, dataset: str = "windows") -> EvalResult:  # noqa: ANN001
    data = window_data(env, f"{windows.__module__}.{dataset}")
    torch.manual_seed(0)
    return evaluate(GPT(16, 16, layers=1, heads=2, width=16), data.val_loader, LanguageModel(), env.device,
                    lockstep=True)  # fmt: skip


def test_the_language_models_figures_are_over_every_real_token_of_the_set_at_any_world_size() -> None:
    torch.manual_seed(0)
    model = GPT(16, 16, layers=1, heads=2, width=16).eval()
    with torch.no_grad():  # one process, plain PyTorch: every window's token losses, one list
        losses = torch.cat([F.cross_entropy(model(x[None])[0], y, reduction="none") for x, y in windows()[1]])
    one = evaluate_gpt_windows(cpu_env(0, 1))
    assert one.samples == 7 and one.metrics["loss"] == pytest.approx(losses.mean().item(), rel=1e-6)
    assert one.metrics["bpb"] == pytest.approx(losses.mean().item() / math.log(2), rel=1e-6)
    for world_size in (2, 3):  # shards of 4 and 3, or 3, 2 and 2 windows: a filler forward on the shorter ones
        ranks = on_ranks(world_size, evaluate_gpt_windows)
        assert all(rank == ranks[0] for rank in ranks) and ranks[0].samples == 7
        # float32 tolerance: the model's logits of a window vary in the last bits with the batch's padded length
        assert ranks[0].metrics == pytest.approx(one.metrics, rel=1e-6)
    masked = evaluate_gpt_windows(cpu_env(0, 1), "masked_windows")
    assert masked.line() == "val_loss=nan val_bpb=nan val_samples=7" and masked.uncounted().startswith(
        "val_loss, val_bpb are NaN: the validation counted no items"
    )


def test_the_log_line_holds_the_windows_tokens_per_s_and_the_gpt_says_its_flops(tmp_path) -> None:
    lm = build_trainer(to_train_config(compose_config(
        ["task=language_model", "model.width=32", "model.layers=2", "data.block_size=16", "data.train_samples=64",
         "data.val_samples=8", "trainer.max_steps=2", "trainer.log_every_n_steps=1"], classification=False)),
        cpu_env(0, 1), tmp_path / "lm")  # fmt: skip
    lm.fit()
    records = [json.loads(line) for line in (tmp_path / "lm" / "metrics.jsonl").read_text().splitlines()]
    first = next(record for record in records if record["kind"] == "train")
    assert first["tokens_per_s"] == pytest.approx(first["samples_per_s"] * 16)
    assert lm.model.flops_per_token(16) == 6 * sum(p.numel() for p in lm.model.parameters()) + 12 * 2 * 32 * 16


def test_task_language_models_vocab_from_reaches_only_a_task_that_takes_it() -> None:
    from {{cookiecutter.package_name}}.engine.assembly.components import build_task

    from ..engine.assembly.test_components import OwnTask, OwnTaskWithOptions

    own, with_options = f"{OwnTask.__module__}.OwnTask", f"{OwnTaskWithOptions.__module__}.OwnTaskWithOptions"
    for task, built in ((own, OwnTask), (f"{LanguageModel.__module__}.LanguageModel", LanguageModel)):
        config = to_train_config(compose_config(["task=language_model", f"task._target_={task}"]))
        assert "vocab_from" in config.task and isinstance(build_task(config.task), built)
    config = to_train_config(compose_config(["task=language_model", f"task._target_={with_options}"]))
    assert build_task(config.task).options == {"vocab_from": None}  # **options takes it
