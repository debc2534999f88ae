"""generate.py: text sampled from a language model's checkpoint, in this process; its mistakes in one line."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}} import generate as entry
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.datasets import stdlib_sources
from {{cookiecutter.package_name}}.datasets.tokenizer import of_folder
from {{cookiecutter.package_name}}.datasets.tokens import prepare_tokens
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.checkpoint.files import load_checkpoint
from {{cookiecutter.package_name}}.models import GPT

from .helpers import compose_config, cpu_env

BLOCK = 16
GPT_TINY = ["model.layers=1", "model.width=16", "model.heads=2", f"data.block_size={BLOCK}", "data.train_samples=16",
            "data.val_samples=4", "data.batch_size=8", "trainer.epochs=1"]  # fmt: skip
PROMPT = "def main():"
CLASSIFIER = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=16", "data.val_size=8",
              "data.batch_size=8", "data.image_size=8", "trainer.epochs=1"]  # fmt: skip


def corpus(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for path in [path for path in stdlib_sources() if 2_000 < path.stat().st_size < 8_000][:6]:
        shutil.copy(path, folder / path.name)
    return folder


def train(run_dir: Path, overrides: list[str]) -> Path:
    """A tiny training's checkpoint."""
    build_trainer(to_train_config(compose_config(overrides)), cpu_env(0, 1), run_dir).fit()
    return next((run_dir / "checkpoints").glob("step_*.pt"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A byte model's, a BPE model's (and its token folder) and a classifier's checkpoint."""
    root = tmp_path_factory.mktemp("generate")
    text = corpus(root / "corpus")
    prepare_tokens(str(text), root / "bpe", val_every=3, tokenizer="bpe", vocab_size=300)
    bpe = ["task=language_model", "data=tokens", f"data.root={root / 'bpe'}", "model.vocab_size=300", *GPT_TINY]
    return {
        "bytes": train(root / "bytes", ["task=language_model", f"data.root={text}", *GPT_TINY]),
        "bpe": train(root / "bpe_run", bpe),
        "classifier": train(root / "cnn", CLASSIFIER),
        "tokens": root / "bpe",
    }


def generate(monkeypatch, capsys, *args: str) -> tuple[str, str]:
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["generate.py", *args])
    entry.main()
    captured = capsys.readouterr()
    return captured.out, captured.err


def refused(monkeypatch, capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as stop:
        generate(monkeypatch, capsys, *args)
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    return error


@pytest.mark.slow
def test_the_same_seed_gives_the_same_text_and_another_seed_other_text(
    in_process, checkpoints, monkeypatch, capsys
) -> None:
    args = [f"ckpt_path={checkpoints['bytes']}", f"prompt='{PROMPT}'", "max_new_tokens=24"]
    first, _ = generate(monkeypatch, capsys, *args, "seed=1")
    again, _ = generate(monkeypatch, capsys, *args, "seed=1")
    other, _ = generate(monkeypatch, capsys, *args, "seed=2")
    assert first == again != other
    assert first.startswith(PROMPT) and first.endswith("\n") and len(first.encode()) > len(PROMPT) + 12


def test_a_bpe_model_samples_and_decodes_with_the_tokenizer_it_trained_with(
    in_process, checkpoints, monkeypatch, capsys
) -> None:
    out, _ = generate(monkeypatch, capsys, f"ckpt_path={checkpoints['bpe']}", f"prompt='{PROMPT}'", "max_new_tokens=8")
    tokenizer = of_folder(checkpoints["tokens"])
    assert out.startswith(PROMPT) and len(tokenizer.encode(out.rstrip("\n"))) > len(tokenizer.encode(PROMPT))
    saved = load_checkpoint(checkpoints["bpe"])["config"]
    assert saved["task"]["vocab_from"] == str(checkpoints["tokens"]), "the folder, not redacted as a secret"


def test_temperature_and_top_k_are_what_tokens_are_drawn_with() -> None:
    torch.manual_seed(0)
    model = GPT(block_size=BLOCK, layers=1, width=16, heads=2).eval()
    prompt = list(b"import os")

    def draw(temperature: float, top_k: int | None, seed: int = 0) -> list[int]:
        return entry.sample(model, prompt, BLOCK, 24, temperature, top_k, torch.Generator().manual_seed(seed))

    def ranks(drawn: list[int]) -> list[int]:
        """Each drawn token's rank among the model's logits given what came before it."""
        ids, found = prompt + drawn, []
        for step, token in enumerate(drawn):
            logits = model(torch.tensor([ids[: len(prompt) + step][-BLOCK:]]))[0, -1]
            found.append(int((logits > logits[token]).sum()))
        return found

    with torch.no_grad():
        assert set(ranks(draw(0, None))) == {0}, "temperature 0: the likeliest token every time"
        assert draw(1e-4, None) == draw(0, None), "a temperature near 0: all but the likeliest vanish"
        assert max(ranks(draw(1.0, 3))) <= 2 and max(ranks(draw(1.0, None))) > 2
        assert max(ranks(draw(1.0, 1))) == 0
    assert draw(1.0, None, seed=5) == draw(1.0, None, seed=5) != draw(1.0, None, seed=6)


def test_a_prompt_longer_than_the_block_is_cropped_to_its_last_block_size_tokens(
    in_process, checkpoints, monkeypatch, capsys
) -> None:
    long = "import os, sys  # " + "x" * 20 + " def f(y):"
    args = [f"ckpt_path={checkpoints['bytes']}", "max_new_tokens=12", "seed=3"]
    out, err = generate(monkeypatch, capsys, *args, f"prompt='{long}'")
    assert out.startswith(long) and f"the prompt is {len(long)} tokens: the model sees its last {BLOCK}" in err
    cropped, err = generate(monkeypatch, capsys, *args, f"prompt='{long[-BLOCK:]}'")
    assert out[len(long) :] == cropped[BLOCK:] and "the prompt is" not in err


def test_refusals_each_in_one_line(in_process, checkpoints, monkeypatch, capsys, tmp_path: Path) -> None:
    bytes_model, prompt = f"ckpt_path={checkpoints['bytes']}", f"prompt='{PROMPT}'"
    error = refused(monkeypatch, capsys, f"ckpt_path={checkpoints['classifier']}", prompt)
    assert "tasks.Classification, not of a language model" in error
    assert "top_k must be" in refused(monkeypatch, capsys, bytes_model, prompt, "top_k=0")  # (config/generate.py's)
    error = refused(monkeypatch, capsys, bytes_model, prompt, f"tokenizer={checkpoints['tokens']}")
    assert "the model has 256 ids and the tokenizer (bpe) 300" in error
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "generate runs in one process" in refused(monkeypatch, capsys, bytes_model, prompt)
    monkeypatch.delenv("WORLD_SIZE")
    # a checkpoint whose token folder is not here: its tokenizer given
    payload = load_checkpoint(checkpoints["bpe"])
    payload["config"]["task"]["vocab_from"] = payload["config"]["data"]["vocab_from"] = str(tmp_path / "gone")
    torch.save(payload, tmp_path / "moved.pt")
    error = refused(monkeypatch, capsys, f"ckpt_path={tmp_path / 'moved.pt'}", prompt)
    assert "which is not here: give its tokenizer with tokenizer=" in error
    tokenizer = f"tokenizer={checkpoints['tokens'] / 'tokenizer.json'}"
    out, _ = generate(monkeypatch, capsys, f"ckpt_path={tmp_path / 'moved.pt'}", prompt, tokenizer)
    assert out.startswith(PROMPT)
    # a doctored checkpoint: nothing is built
    payload["config"]["model"]["_target_"] = "builtins.print"
    torch.save(payload, tmp_path / "doctored.pt")
    error = refused(monkeypatch, capsys, f"ckpt_path={tmp_path / 'doctored.pt'}", prompt)
    assert "model._target_=builtins.print" in error and "trust_checkpoint=true" in error
    # a function of the package's own, in a nested node (as eval.py and predict.py refuse it: test_trust.py's)
    target = f"{entry.__package__}.engine.checkpoint.files.write_atomically"
    model = load_checkpoint(checkpoints["bpe"])["config"]["model"]
    payload["config"]["model"] = {**model, "extra": {"_target_": target}}
    torch.save(payload, tmp_path / "nested.pt")
    error = refused(monkeypatch, capsys, f"ckpt_path={tmp_path / 'nested.pt'}", prompt)
    assert f"names model.extra._target_={target}, " in error


@pytest.mark.parametrize("prompt", ["def f(a, b):", "null", "print(x)  # [1, 2], {'k': None}", "a,b"])
def test_a_prompt_is_taken_as_plain_text_commas_parentheses_and_null_too(
    in_process, checkpoints, monkeypatch, capsys, prompt: str
) -> None:
    """What Hydra's override grammar would not read as a string (a parse error, a sweep, null) is the text."""
    out, _ = generate(monkeypatch, capsys, f"ckpt_path={checkpoints['bytes']}", f"prompt={prompt}", "max_new_tokens=6")
    assert out.startswith(prompt) and len(out.encode()) > len(prompt.encode()) + 1


@pytest.mark.slow
def test_a_prompt_file_is_read_as_it_is_and_its_mistakes_are_refused_in_one_line(
    in_process, checkpoints, monkeypatch, capsys, tmp_path: Path
) -> None:
    text = "def f(a, b=None):\n    return f'{a}, ${b}' \\\n"
    (tmp_path / "prompt.txt").write_text(text)
    args = [f"ckpt_path={checkpoints['bytes']}", "max_new_tokens=6", "seed=1"]
    out, _ = generate(monkeypatch, capsys, *args, "--prompt-file", str(tmp_path / "prompt.txt"))
    assert out.startswith(text)
    assert generate(monkeypatch, capsys, *args, f"--prompt-file={tmp_path / 'prompt.txt'}")[0] == out
    (tmp_path / "empty.txt").write_text("")
    for given, said in (
        (["--prompt-file", str(tmp_path / "missing.txt")], f"--prompt-file {tmp_path / 'missing.txt'}: No such file"),
        (["--prompt-file", str(tmp_path / "empty.txt")], "empty.txt is empty: give a file of the prompt's text"),
        (["--prompt-file"], "--prompt-file needs a FILE"),
        (["--prompt-file", str(tmp_path / "prompt.txt"), "prompt=x"], "prompt= and --prompt-file both given"),
    ):
        assert said in refused(monkeypatch, capsys, *args, *given)
