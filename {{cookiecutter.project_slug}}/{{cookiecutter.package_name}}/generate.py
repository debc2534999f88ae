"""Sample text from a language model's checkpoint (task=language_model), nanoGPT's sample.py:
`python -m {{ cookiecutter.package_name }}.generate ckpt_path=... prompt="..." max_new_tokens=N [temperature=T top_k=K seed=S]`,
or `{{ cookiecutter.package_name }}-generate ...` once installed. Prints the prompt and its continuation.

The checkpoint is read as eval.py reads it: its saved config composed (checked by trust.py before anything
is built), its weights (the EMA's where the run kept one), `.../checkpoints/best` for keep_best's best. The
tokenizer is the one it trained with (data=tokens's folder, else bytes), or `tokenizer=`. Generation is
sequential: one process, on a GPU where there is one; under torchrun with more than one process it is refused.
The same checkpoint, prompt, settings and seed give the same text on the same device.

The prompt is plain text: `prompt=TEXT` as one argument (commas, parentheses, `null` and all: whatever Hydra
would not read as a string is taken as it is written), or `--prompt-file FILE`, the file's text as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig
from torch import nn

from .common.errors import ConfigError
from .config import config_dir, let_group_keys_through
from .config.generate import GenerateConfig
from .config.targets import locate
from .datasets.tokenizer import Tokenizer, find, of_folder
from .engine.assembly.components import build_model
from .engine.assembly.entry import checkpoint_config, prepare, reporting_user_errors
from .engine.checkpoint.weights import load_weights
from .tasks.language_model import LanguageModel

PROMPT_FILE = "--prompt-file"
PLAIN = "prompt=plain_text"  # what Hydra is given in place of a prompt taken as plain text (run_generate sets it)
_given: dict[str, str] = {}  # the prompt main took from the command line before Hydra: {"text"|"file"|"error": ...}


@torch.inference_mode()
def sample(
    model: nn.Module, ids: list[int], block_size: int, max_new_tokens: int, temperature: float,
    top_k: int | None, generator: torch.Generator,
) -> list[int]:  # fmt: skip
    """`max_new_tokens` ids drawn one after the other, each from the model's next-token distribution given
    the last `block_size` ids (the logits over `temperature`, among the `top_k` likeliest; temperature 0:
    the likeliest)."""
    device = next(model.parameters()).device
    context = torch.tensor([ids], dtype=torch.long, device=device)
    for _ in range(max_new_tokens):
        logits = model(context[:, -block_size:])[:, -1, :].float()
        if temperature == 0:
            token = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.shape[-1]:
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        context = torch.cat([context, token], dim=1)
    return context[0, len(ids) :].tolist()


def checkpoint_tokenizer(config: GenerateConfig) -> Tokenizer:
    """`tokenizer=` where given, else the checkpoint's: its task's token folder (data=tokens), else bytes."""
    if config.tokenizer is not None:
        if not Path(config.tokenizer).exists():
            raise ConfigError(
                f"tokenizer={config.tokenizer}: no such file or folder; give a token folder or a tokenizer.json"
            )
        return find(config.tokenizer)
    folder = config.task.get("vocab_from")
    if folder is None:
        return Tokenizer()  # data=text: bytes
    if not (Path(folder) / "meta.json").is_file():
        raise ConfigError(
            f"the checkpoint trained on the tokens of {folder}, which is not here: give its tokenizer with "
            "tokenizer=<token folder or tokenizer.json>"
        )
    return of_folder(folder)


def block_size_of(model: nn.Module, config: GenerateConfig) -> int:
    """The longest context the model takes: its position table's length (GPT), else model.block_size."""
    positions = getattr(model, "position_embedding", None)
    size = positions.num_embeddings if isinstance(positions, nn.Embedding) else config.model.get("block_size")
    if not isinstance(size, int):
        raise ConfigError("the checkpoint's model has no block_size: generate needs a model.block_size")
    return size


def run_generate(cfg: DictConfig) -> None:
    """Print the prompt and the text the checkpoint's language model continues it with."""

    def body() -> None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError(
                "generate runs in one process (sampling is sequential): run it with python -m, not torchrun"
            )
        prompt = plain_prompt(_given)
        path, payload, config = checkpoint_config(cfg, "generate", components=False)
        assert isinstance(config, GenerateConfig)
        if prompt is not None:
            config.prompt = prompt
        task = locate(str(config.task["_target_"]))
        if not (isinstance(task, type) and issubclass(task, LanguageModel)):
            raise ConfigError(
                f"ckpt_path={path} is a checkpoint of task._target_={config.task['_target_']}, not of a language "
                "model: generate samples from a task=language_model run's checkpoint"
            )
        tokenizer = checkpoint_tokenizer(config)
        vocab_size = config.model.get("vocab_size")
        if vocab_size is not None and vocab_size != tokenizer.vocab_size:
            raise ConfigError(
                f"the model has {vocab_size} ids and the tokenizer ({tokenizer.kind}) {tokenizer.vocab_size}: give "
                "the tokenizer it trained with, tokenizer=<token folder or tokenizer.json>"
            )
        model = build_model(config.model)
        load_weights(path, model, payload)  # whatever strategy wrote it; the EMA's weights where kept
        model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
        block_size = block_size_of(model, config)
        ids = tokenizer.encode(config.prompt)
        if len(ids) > block_size:
            print(f"(the prompt is {len(ids)} tokens: the model sees its last {block_size})", file=sys.stderr)
        generator = torch.Generator(next(model.parameters()).device).manual_seed(config.seed)
        new = sample(model, ids, block_size, config.max_new_tokens, config.temperature, config.top_k, generator)
        print(tokenizer.decode(ids + new), flush=True)

    reporting_user_errors(body)


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="generate")
def generate_text(cfg: DictConfig) -> None:
    run_generate(cfg)


def take_prompt(argv: list[str]) -> dict[str, str]:
    """The prompt taken out of `argv` before Hydra parses it, where Hydra would not read it as the string written
    (`prompt=def f(a, b):`, `prompt=null`), or from `--prompt-file FILE`; `argv` then holds PLAIN in its place. A
    prompt Hydra reads as a string (`prompt='...'`, `prompt=word`) is left to it, as before."""
    taken: dict[str, str] = {}
    rest, args, prompts = argv[:1], iter(argv[1:]), 0
    for arg in args:
        if arg == PROMPT_FILE or arg.startswith(f"{PROMPT_FILE}="):
            taken["file"] = arg.partition("=")[2] if "=" in arg else next(args, "")
            if not taken["file"]:
                taken["error"] = f"{PROMPT_FILE} needs a FILE: {PROMPT_FILE} path/to/prompt.txt"
        elif arg.startswith("prompt="):
            prompts += 1
            if hydra_string(arg):
                rest.append(arg)
            else:
                taken["text"] = arg.removeprefix("prompt=")
        else:
            rest.append(arg)
    if "file" in taken and prompts:
        taken["error"] = f"prompt= and {PROMPT_FILE} both given: give the prompt once, as one or the other"
    if taken:
        rest.append(PLAIN)
    argv[:] = rest
    return taken


def hydra_string(arg: str) -> bool:
    """Whether Hydra reads the override `arg` as a string (not a parse error, a sweep, null, a number, a list)."""
    try:
        return isinstance(OverridesParser.create().parse_override(arg).value(), str)
    except Exception:  # Hydra's parse errors: a prompt of code, taken as it is
        return False


def plain_prompt(taken: dict[str, str]) -> str | None:
    """The prompt take_prompt took (None: Hydra's prompt=), read from its file where it names one."""
    if "error" in taken:
        raise ConfigError(taken["error"])
    if "file" in taken:
        try:
            text = Path(taken["file"]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise ConfigError(f"{PROMPT_FILE} {taken['file']}: {why}: give a file of the prompt's text") from None
        if not text:
            raise ConfigError(f"{PROMPT_FILE} {taken['file']} is empty: give a file of the prompt's text")
        return text
    return taken.get("text")


def main() -> None:
    """The process's entry (console script, `python -m`)."""
    _given.clear()
    _given.update(take_prompt(sys.argv))
    prepare(sys.argv)
    let_group_keys_through(sys.argv)
    generate_text()


if __name__ == "__main__":
    main()
