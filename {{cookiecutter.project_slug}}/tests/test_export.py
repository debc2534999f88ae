"""export.py: one plain weights file from a run's checkpoint, loadable without the project's code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config
from {{cookiecutter.package_name}}.engine.distributed.process_group import weights_fingerprint
from {{cookiecutter.package_name}}.export import export, main
from {{cookiecutter.package_name}}.models import GPT, SmallCNN

from .helpers import compose_config


def write_checkpoint(path: Path, step: int = 7, **extra: object) -> dict[str, torch.Tensor]:
    """A ddp checkpoint as the trainer writes one (a config, the model's weights, a step); its weights."""
    config = to_plain_dict(to_train_config(compose_config(["model=small_cnn", "model.width=4", "data.num_classes=3"])))
    torch.manual_seed(step)
    model = SmallCNN(num_classes=3, width=4)
    with torch.no_grad():  # BatchNorm statistics that are not the fresh ones either
        for name, buffer in model.named_buffers():
            if "running" in name:
                buffer.uniform_(0.5, 2.0)
    weights = model.state_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": config, "model": weights, "step": step, "format_version": 1, **extra}, path)
    return weights


def test_the_exported_file_holds_exactly_the_checkpoints_weights_as_plain_tensors(tmp_path: Path) -> None:
    weights = write_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000007.pt")
    out = tmp_path / "export" / "deeper" / "model.pt"  # folders made as needed
    line = export(tmp_path / "run" / "checkpoints" / "step_00000007.pt", out)
    assert line == f"weights at step 7: sha256 {weights_fingerprint(weights)}"
    exported = torch.load(out, weights_only=True)
    assert exported.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(exported[name], tensor), name
    fresh = SmallCNN(num_classes=3, width=4)
    fresh.load_state_dict(exported)  # the model the run's config builds, without the project's code
    assert not list(out.parent.glob(".tmp_*")), "written atomically: no temporary file left"


def test_the_command_line_says_what_it_wrote(tmp_path: Path, capsys) -> None:
    weights = write_checkpoint(tmp_path / "step_00000012.pt", step=12)
    main([str(tmp_path / "step_00000012.pt"), str(tmp_path / "model.pt")])
    out = capsys.readouterr().out
    assert out == f"wrote {tmp_path / 'model.pt'}: weights at step 12: sha256 {weights_fingerprint(weights)}\n"


def test_an_existing_output_is_never_overwritten_and_refused_in_one_line(tmp_path: Path, capsys) -> None:
    write_checkpoint(tmp_path / "step_00000007.pt")
    out = tmp_path / "model.pt"
    out.write_bytes(b"someone's weights")
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "step_00000007.pt"), str(out)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"error: {out} exists: give another output path (nothing is overwritten)\n"
    assert out.read_bytes() == b"someone's weights"


@pytest.mark.parametrize("kind", ["text", "no_model", "missing"])
def test_what_is_not_a_checkpoint_is_refused_in_one_line(tmp_path: Path, capsys, kind: str) -> None:
    source = tmp_path / "step_00000003.pt"
    if kind == "text":
        source.write_text("not weights")
    elif kind == "no_model":
        torch.save({"step": 3, "weights": {}}, source)
    with pytest.raises(SystemExit) as stopped:
        main([str(source), str(tmp_path / "model.pt")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {source} "), err
    assert err.endswith("; give a run's checkpoints/step_<N>.pt or step_<N>/\n") and err.count("\n") == 1, err
    assert not (tmp_path / "model.pt").exists()


def test_a_checkpoint_of_newer_code_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "step_00000007.pt", format_version=99)
    with pytest.raises(ConfigError, match="format version 99, newer than this code's 1"):
        export(tmp_path / "step_00000007.pt", tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()


def test_a_safetensors_out_is_read_by_safetensors_own_loader_and_by_init_from(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    from {{cookiecutter.package_name}}.engine.assembly.init_weights import read_weights

    weights = write_checkpoint(tmp_path / "step_00000007.pt")
    line = export(tmp_path / "step_00000007.pt", tmp_path / "model.safetensors")
    loaded = load_file(tmp_path / "model.safetensors")
    assert loaded.keys() == weights.keys() and all(torch.equal(loaded[name], weights[name]) for name in weights)
    with safe_open(tmp_path / "model.safetensors", "pt") as file:
        assert file.metadata() == {"step": "7", "weights": line}
    read = read_weights(tmp_path / "model.safetensors")
    assert read.keys() == weights.keys() and all(torch.equal(read[name], weights[name]) for name in weights)


def test_tied_weights_go_to_safetensors_and_tie_again(tmp_path: Path) -> None:
    """A model whose head shares the embedding's tensor (weight tying): safetensors keeps no shared storage."""
    from safetensors.torch import load_file

    from {{cookiecutter.package_name}}.engine.checkpoint.files import write_atomically
    from {{cookiecutter.package_name}}.export import safetensors_writer

    def tied() -> torch.nn.Module:
        model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
        model[1].weight = model[0].weight
        return model

    model = tied()
    write_atomically(model.state_dict(), tmp_path / "tied.safetensors", safetensors_writer({}))
    fresh = tied()
    fresh.load_state_dict(load_file(tmp_path / "tied.safetensors"))
    assert torch.equal(fresh[0].weight, model[0].weight) and fresh[1].weight is fresh[0].weight


def write_gpt_checkpoint(path: Path, vocab_from: Path) -> GPT:
    """A language model's ddp checkpoint (a GPT over a BPE's 300 ids, trained on the tokens of `vocab_from`)."""
    overrides = ["task=language_model", "model.width=16", "model.layers=2", "model.heads=2", "data.block_size=16",
                 "model.vocab_size=300"]  # fmt: skip
    config = to_plain_dict(to_train_config(compose_config(overrides)))
    config["task"]["vocab_from"] = str(vocab_from)
    torch.manual_seed(3)
    model = GPT(block_size=16, vocab_size=300, layers=2, heads=2, width=16).eval()
    torch.save({"config": config, "model": model.state_dict(), "step": 5, "format_version": 1}, path)
    return model


def test_format_hf_writes_a_gpt2_that_transformers_loads_with_the_same_logits_and_tokenizer(tmp_path, capsys) -> None:
    transformers = pytest.importorskip("transformers")
    from {{cookiecutter.package_name}}.datasets.tokenizer import save, train_bpe

    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog; " * 50)
    tokenizer = train_bpe([tmp_path / "corpus.txt"], 300)
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "meta.json").write_text(json.dumps(save(tokenizer, tmp_path / "tokens")))
    model = write_gpt_checkpoint(tmp_path / "step_00000005.pt", tmp_path / "tokens")
    main([str(tmp_path / "step_00000005.pt"), str(tmp_path / "hf"), "--format", "hf"])
    line = f"GPT-2 of the weights at step 5: sha256 {weights_fingerprint(model.state_dict())}"
    assert capsys.readouterr().out == f"wrote {tmp_path / 'hf'}: {line}\n"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    tokens = torch.tensor([tokenizer.encode("the lazy fox jumps")])
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, model(tokens), atol=1e-5, rtol=0)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert hf_tokenizer("the lazy fox jumps")["input_ids"] == tokens[0].tolist()
    assert (tmp_path / "hf" / "provenance.json").is_file(), "the run's record inside the folder, as for any export"


def test_format_hf_refuses_a_model_that_is_not_the_gpt_in_one_line(tmp_path: Path, capsys) -> None:
    write_checkpoint(tmp_path / "step_00000007.pt")
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "step_00000007.pt"), str(tmp_path / "hf"), "--format", "hf"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --format hf: the checkpoint's model is SmallCNN, not models.GPT"), err
    assert err.count("\n") == 1
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".tmp_*"))
