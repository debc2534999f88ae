"""engine/checkpoint/hf.py: the GPT as a Hugging Face GPT-2 that transformers loads with the same logits, and a
GPT-2 that transformers made as model.init_from, fine-tuned under each strategy. Offline: nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config
from {{cookiecutter.package_name}}.engine.assembly.init_weights import initialise_from
from {{cookiecutter.package_name}}.engine.checkpoint.hf import read_gpt2, to_gpt2, write_folder
from {{cookiecutter.package_name}}.engine.distributed.process_group import weights_fingerprint
from {{cookiecutter.package_name}}.export import main
from {{cookiecutter.package_name}}.models import GPT, SmallCNN

from ...helpers import CPU, STRATEGIES, compose_config, on_ranks
from ...test_export import write_checkpoint

transformers = pytest.importorskip("transformers")
TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "n_positions": 64}  # the GPT-2 of the tests
JOB = ["task=language_model", "model.width=32", "model.layers=2", "model.heads=2", "model.gelu=tanh",
       "data.block_size=64", "data.train_samples=8", "data.val_samples=4", "data.batch_size=2",
       "trainer.max_steps=1"]  # fmt: skip


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    assert type(model).__name__ == "GPT2LMHeadModel"
    with torch.no_grad():
        return model(tokens).logits


def gpt(**sizes: object) -> GPT:
    torch.manual_seed(0)
    return GPT(**{"block_size": 16, "vocab_size": 50, "layers": 2, "heads": 2, "width": 16, **sizes}).eval()


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory) -> Path:
    """A tiny random GPT-2 as transformers itself saves one (tied head, gelu_new)."""
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    torch.manual_seed(1)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("gelu", ["exact", "tanh"])
def test_the_gpt_goes_to_transformers_and_back_with_the_same_logits(tmp_path: Path, gelu: str) -> None:
    model = gpt(gelu=gelu)
    config, tensors = to_gpt2(model)
    write_folder(tmp_path / "out", config, tensors, None)
    tokens = torch.randint(0, 50, (3, 16))
    with torch.no_grad():
        ours = model(tokens)
    torch.testing.assert_close(hf_logits(tmp_path / "out", tokens), ours, atol=1e-5, rtol=0)
    torch.manual_seed(5)  # another initialisation, which the folder's weights replace
    back = GPT(block_size=16, vocab_size=50, layers=2, heads=2, width=16, gelu=gelu).eval()
    back.load_state_dict(read_gpt2(tmp_path / "out", back))
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), ours, atol=1e-5, rtol=0)
    assert not list(tmp_path.glob(".tmp_*")), "the folder is made whole, then renamed"


def test_a_gpt2_made_by_transformers_loads_as_init_from_with_its_logits(hf_gpt2: Path) -> None:
    model = GPT(block_size=64, layers=2, heads=2, width=32, gelu="tanh").eval()
    initialise_from(model, str(hf_gpt2), CPU, has_checkpoint=False)
    tokens = torch.randint(0, 256, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf_logits(hf_gpt2, tokens), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"n_embd": 64}, "its config.json has n_embd=64, the model width=32: set model.width=64"),
        ({"n_positions": 128}, "n_positions=128, the model block_size=64: set data.block_size=128"),
        ({"activation_function": "gelu"}, "its activation_function=gelu, the model's GELU tanh: set model.gelu=exact"),
        ({"activation_function": "relu"}, "its activation_function=relu is not a GELU the GPT has (exact or tanh)"),
        ({"layer_norm_epsilon": 1e-6}, "its layer_norm_epsilon=1e-06 has no counterpart in the project's GPT"),
        ({"model_type": "llama"}, "its config.json is a llama, not a gpt2"),
    ],
)
def test_a_gpt2_that_does_not_fit_is_one_line_naming_what_to_change(hf_gpt2, tmp_path, change, said) -> None:
    folder = tmp_path / "changed"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(hf_gpt2 / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({**json.loads((hf_gpt2 / "config.json").read_text()), **change}))
    with pytest.raises(ConfigError) as error:
        read_gpt2(folder, GPT(block_size=64, layers=2, heads=2, width=32, gelu="tanh"))
    assert said in str(error.value) and "\n" not in str(error.value)


def test_pickled_weights_are_not_read_and_a_model_that_is_no_gpt_is_refused(hf_gpt2, tmp_path) -> None:
    (tmp_path / "config.json").write_text((hf_gpt2 / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"a pickle")
    with pytest.raises(ConfigError, match="holds no model.safetensors: save it with save_pretrained"):
        read_gpt2(tmp_path, GPT(block_size=64, layers=2, heads=2, width=32, gelu="tanh"))
    with pytest.raises(ConfigError, match="is a GPT-2, and the model is SmallCNN: give model=gpt"):
        read_gpt2(hf_gpt2, SmallCNN(num_classes=3))
    with pytest.raises(ConfigError, match="the checkpoint's model is SmallCNN, not models.GPT"):
        to_gpt2(SmallCNN(num_classes=3))


def fine_tune(env: DistEnv, folder: Path, run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    """One step from the GPT-2 under each strategy; the weights each run started from (whole)."""
    from {{cookiecutter.package_name}}.config import to_train_config
    from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

    from ...helpers import compose_config

    started = {}
    for strategy in STRATEGIES:
        overrides = [*JOB, f"strategy={strategy}", f"model.init_from={folder}"]
        trainer = build_trainer(to_train_config(compose_config(overrides)), env, run_dir / strategy)
        started[strategy] = {name: tensor.clone() for name, tensor in trainer.strategy.full_weights().items()}
        trainer.fit()
    return started


@pytest.mark.slow
def test_a_gpt2_made_by_transformers_is_fine_tuned_under_each_strategy(hf_gpt2: Path, tmp_path: Path) -> None:
    started = on_ranks(2, fine_tune, hf_gpt2, tmp_path)[0]
    tokens = torch.randint(0, 256, (2, 64))
    expected = hf_logits(hf_gpt2, tokens)
    for strategy, weights in started.items():
        model = GPT(block_size=64, layers=2, heads=2, width=32, gelu="tanh").eval()
        model.load_state_dict(weights)
        with torch.no_grad():
            torch.testing.assert_close(model(tokens), expected, atol=1e-5, rtol=0, msg=strategy)
        assert list((tmp_path / strategy / "checkpoints").glob("step_*")), f"{strategy}: and it trained"


def test_the_export_and_init_from_find_this_format_by_what_is_present(capsys) -> None:
    """Nothing outside hf.py names it (engine/checkpoint/weights.py's weight_formats): a project without the
    module has neither `--format hf` nor a GPT-2 folder as model.init_from, and nothing else changes."""
    from {{cookiecutter.package_name}}.engine.checkpoint import hf
    from {{cookiecutter.package_name}}.engine.checkpoint.weights import weight_formats
    from {{cookiecutter.package_name}}.export import main

    assert weight_formats() == {"hf": hf}
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--format {plain,hf}" in capsys.readouterr().out


# export.py --format hf


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


def test_format_hf_refuses_a_model_that_is_not_the_gpt_in_one_line(tmp_path: Path, capsys) -> None:
    write_checkpoint(tmp_path / "step_00000007.pt")
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "step_00000007.pt"), str(tmp_path / "hf"), "--format", "hf"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --format hf: the checkpoint's model is SmallCNN, not models.GPT"), err
    assert err.count("\n") == 1
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".tmp_*"))
