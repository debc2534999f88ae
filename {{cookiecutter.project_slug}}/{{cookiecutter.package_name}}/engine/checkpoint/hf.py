"""Hugging Face's GPT-2 in and out: the project's GPT (models/gpt.py) as a folder that
`transformers.AutoModelForCausalLM.from_pretrained` loads (export.py --format hf), and such a folder as
model.init_from's weights (assembly/init_weights.py). transformers is not imported: config.json is written and
read as JSON, the weights as safetensors (nothing unpickled, nothing downloaded).

The GPT is GPT-2's layout: pre-norm blocks, q, k and v packed in one biased projection (in that order, heads
side by side), an MLP four times as wide, learnt positions, a final layer norm, a head without bias. Where the
two differ, the config says so: the GPT's head is its own (tie_word_embeddings false; a tied GPT-2's embedding
is copied into it), its GELU is exact unless model.gelu=tanh (activation_function gelu, else gelu_new), it has
model.block_size positions (n_positions), and one dropout stands for GPT-2's three. GPT-2's Conv1D keeps a
weight as (in, out), a Linear as (out, in): those are transposed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ...common.errors import ConfigError
from ...datasets.tokenizer import FILE
from ...models.gpt import GPT, Block

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
BLOCK = {  # a block's module: GPT-2's, and whether its weight is a Conv1D's (transposed)
    "attention_norm": ("ln_1", False),
    "attention.qkv": ("attn.c_attn", True),
    "attention.proj": ("attn.c_proj", True),
    "mlp_norm": ("ln_2", False),
    "mlp.0": ("mlp.c_fc", True),
    "mlp.2": ("mlp.c_proj", True),
}
TOP = {
    "token_embedding.weight": "transformer.wte.weight", "position_embedding.weight": "transformer.wpe.weight",
    "norm.weight": "transformer.ln_f.weight", "norm.bias": "transformer.ln_f.bias", "head.weight": "lm_head.weight",
}  # fmt: skip
GELUS = {"exact": "gelu", "tanh": "gelu_new"}  # model.gelu -> activation_function
TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # GPT-2's approximations: the same tanh formula
SIZES = (  # GPT-2's config key, the GPT's setting, and the setting a user changes
    ("n_embd", "width", "model.width"), ("n_layer", "layers", "model.layers"), ("n_head", "heads", "model.heads"),
    ("vocab_size", "vocab_size", "model.vocab_size"), ("n_positions", "block_size", "data.block_size"),
)  # fmt: skip


def names(layers: int) -> list[tuple[str, str, bool]]:
    """Every tensor of a GPT of `layers` blocks: its name, GPT-2's, and whether it is transposed."""
    blocks = [(f"blocks.{i}.{ours}.{kind}", f"transformer.h.{i}.{theirs}.{kind}", conv1d and kind == "weight")
              for i in range(layers) for ours, (theirs, conv1d) in BLOCK.items()
              for kind in ("weight", "bias")]  # fmt: skip
    return [(ours, theirs, False) for ours, theirs in TOP.items()] + blocks


def sizes(model: GPT) -> dict[str, Any]:
    """The GPT's settings that GPT-2's config states, by the GPT's own names."""
    block = cast(Block, model.blocks[0])
    return {"width": model.head.in_features, "layers": len(model.blocks), "heads": block.attention.heads,
            "vocab_size": model.head.out_features, "block_size": model.position_embedding.num_embeddings,
            "gelu": "tanh" if cast(nn.GELU, block.mlp[1]).approximate == "tanh" else "exact"}  # fmt: skip


def to_gpt2(model: nn.Module) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The model as GPT-2: config.json's contents and model.safetensors' tensors. Anything that is not the
    project's GPT, or a GPT whose tensors are not the ones GPT-2 has, is refused in one line."""
    if not isinstance(model, GPT):
        raise ConfigError(f"--format hf: the checkpoint's model is {type(model).__name__}, not models.GPT, the one "
                          "model that maps to GPT-2: export it as .safetensors or .pt")  # fmt: skip
    own = sizes(model)
    weights = model.state_dict()
    pairs = names(own["layers"])
    expected = {ours for ours, _, _ in pairs}
    if weights.keys() != expected:
        odd = sorted(weights.keys() ^ expected)
        raise ConfigError(f"--format hf: the GPT's tensors differ from GPT-2's ({', '.join(odd[:4])}): "
                          "models/gpt.py's GPT was changed; export it as .safetensors or .pt")  # fmt: skip
    dropout = model.dropout.p
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": own["vocab_size"], "n_positions": own["block_size"], "n_embd": own["width"],
        "n_layer": own["layers"], "n_head": own["heads"], "n_inner": None,
        "activation_function": GELUS[own["gelu"]], "layer_norm_epsilon": model.norm.eps,
        "resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout,
        "scale_attn_weights": True, "tie_word_embeddings": False,  # the GPT's head is its own
        "bos_token_id": None, "eos_token_id": None,  # GPT-2's 50256 is no id of a smaller vocabulary
    }  # fmt: skip
    tensors = {theirs: (weights[ours].t() if conv1d else weights[ours]).detach().contiguous().clone()
               for ours, theirs, conv1d in pairs}  # fmt: skip
    return config, tensors


def write_folder(out: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], tokenizer: Path | None) -> None:
    """config.json, model.safetensors and the tokenizer (tokenizer.json, which transformers' fast tokenizer reads)
    into `out`, made whole in a temporary folder beside it and then renamed: no half-written folder."""
    from safetensors.torch import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp_", dir=out.parent))
    try:
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(staging / WEIGHTS), metadata={"format": "pt"})  # "pt": what transformers expects
        if tokenizer is not None:
            shutil.copyfile(tokenizer, staging / "tokenizer.json")
            tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": config["n_positions"]}
            (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# What the rest of the project finds here by what is present (weights.py's weight_formats): export.py's
# `--format hf`, and model.init_from's reader of such a folder (assembly/init_weights.py).
WEIGHT_FORMAT = "hf"
FORMAT_HELP = "hf: a folder that transformers' AutoModelForCausalLM loads as a GPT-2 (model=gpt only)"


def export_to(out: Path, model: nn.Module, saved: dict[str, Any], line: str) -> str:
    """export.py --format hf: the model as a GPT-2 folder at `out`, with the tokenizer.json of a BPE run; the
    line the export says."""
    config, tensors = to_gpt2(model)
    tokenizer, note = bpe_tokenizer(saved)
    write_folder(out, config, tensors, tokenizer)
    return f"GPT-2 of the {line}{note}"


def bpe_tokenizer(saved: dict) -> tuple[Path | None, str]:
    """The tokenizer.json of the token folder a BPE run trained on (data=tokens), and a note where it is not here."""
    folder = (saved.get("task") or {}).get("vocab_from")
    if not folder:
        return None, ""  # bytes: ids 0-255 are the bytes themselves, no tokenizer file
    try:
        meta = json.loads((Path(folder) / "meta.json").read_text())
    except (OSError, ValueError):
        return None, f"; no tokenizer.json: the run's token folder {folder} is not here"
    return (Path(folder) / meta.get("tokenizer_file", FILE), "") if meta.get("tokenizer") == "bpe" else (None, "")


def is_gpt2_folder(path: Path) -> bool:
    """A folder Hugging Face wrote (save_pretrained): its config.json beside the weights."""
    return path.is_dir() and (path / CONFIG).is_file()


def read_gpt2(folder: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """A GPT-2 folder's weights by the GPT's names, once its config.json is checked against `model`: a size
    that differs is one line naming the setting to change, a difference the GPT cannot take one line naming it."""
    where = f"model.init_from={folder}"
    try:
        config = json.loads((folder / CONFIG).read_text())
    except ValueError as error:
        raise ConfigError(f"{where}: its {CONFIG} is not JSON ({error})") from None
    check_config(config, model, where)
    tensors = read_tensors(folder, where)
    return from_gpt2(tensors, config, len(model.blocks), where)  # type: ignore[arg-type]


def check_config(config: dict[str, Any], model: nn.Module, where: str) -> None:
    if config.get("model_type") != "gpt2":
        raise ConfigError(f"{where}: its {CONFIG} is a {config.get('model_type')}, not a gpt2: only a GPT-2 maps to "
                          "the project's GPT")  # fmt: skip
    if not isinstance(model, GPT):
        raise ConfigError(f"{where} is a GPT-2, and the model is {type(model).__name__}: give model=gpt")
    own = sizes(model)
    for theirs, ours, setting in SIZES:
        if config.get(theirs) != own[ours]:
            raise ConfigError(f"{where}: its {CONFIG} has {theirs}={config.get(theirs)}, the model {ours}="
                              f"{own[ours]}: set {setting}={config.get(theirs)}")  # fmt: skip
    activation = config.get("activation_function", "gelu_new")
    gelu = "tanh" if activation in TANH else "exact" if activation == "gelu" else None
    if gelu is None:
        raise ConfigError(f"{where}: its activation_function={activation} is not a GELU the GPT has (exact or tanh)")
    if gelu != own["gelu"]:
        raise ConfigError(f"{where}: its activation_function={activation}, the model's GELU {own['gelu']}: "
                          f"set model.gelu={gelu}")  # fmt: skip
    unmapped = {  # GPT-2's options the GPT has no counterpart of: their value where set
        "n_inner": config.get("n_inner") not in (None, 4 * own["width"]),
        "layer_norm_epsilon": config.get("layer_norm_epsilon", 1e-5) != model.norm.eps,
        "scale_attn_weights": config.get("scale_attn_weights", True) is not True,
        "scale_attn_by_inverse_layer_idx": bool(config.get("scale_attn_by_inverse_layer_idx")),
        "add_cross_attention": bool(config.get("add_cross_attention")),
    }
    for key, differs in unmapped.items():
        if differs:
            raise ConfigError(f"{where}: its {key}={config.get(key)} has no counterpart in the project's GPT "
                              f"(docs/language_model.md)")  # fmt: skip


def read_tensors(folder: Path, where: str) -> dict[str, torch.Tensor]:
    """model.safetensors, or the files its index names (a sharded save_pretrained); pickled weights are not read."""
    from safetensors.torch import load_file

    if (folder / WEIGHTS).is_file():
        files = [folder / WEIGHTS]
    elif (folder / INDEX).is_file():
        files = [folder / name for name in sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))]
    else:
        raise ConfigError(f"{where} holds no {WEIGHTS}: save it with save_pretrained(..., safe_serialization=True) "
                          "(pickled weights are not read)")  # fmt: skip
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(file, device="cpu"))
    return tensors


def from_gpt2(tensors: dict[str, torch.Tensor], config: dict, layers: int, where: str) -> dict[str, torch.Tensor]:
    """GPT-2's tensors by the GPT's names. A GPT2Model's own save has no `transformer.` prefix; a tied head is
    not saved, and the embedding stands for it (the GPT's head then trains on its own)."""
    tensors = {name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}": tensor
               for name, tensor in tensors.items()}  # fmt: skip
    if "lm_head.weight" not in tensors and config.get("tie_word_embeddings", True):
        tensors["lm_head.weight"] = tensors.get("transformer.wte.weight")  # type: ignore[assignment]
    missing = [theirs for _, theirs, _ in names(layers) if tensors.get(theirs) is None]
    if missing:
        raise ConfigError(f"{where}: its weights lack {', '.join(missing[:4])}: not a whole GPT-2")
    return {ours: (tensors[theirs].t() if conv1d else tensors[theirs]).contiguous().clone()
            for ours, theirs, conv1d in names(layers)}  # fmt: skip


# model.init_from's side of the format (weights.py's weight_formats): whether a path is such a folder, and its
# weights by the model's names.
takes, read = is_gpt2_folder, read_gpt2
