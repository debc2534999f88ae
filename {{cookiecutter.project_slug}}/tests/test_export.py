"""export.py: one plain weights file from a run's checkpoint, loadable without the project's code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config
from {{cookiecutter.package_name}}.engine.distributed.process_group import weights_fingerprint
from {{cookiecutter.package_name}}.export import export, main
from {{cookiecutter.package_name}}.models import SmallCNN

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
