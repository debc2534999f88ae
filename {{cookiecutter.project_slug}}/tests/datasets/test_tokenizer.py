"""datasets/tokenizer.py: a byte-level BPE trained offline on a corpus (or a tokenizer.json taken as it is) into a
token folder, which training, evaluation (val_bpb in bits per byte) and generate read back."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}} import train as train_entry
from {{cookiecutter.package_name}}.common.errors import USER_ERROR_EXIT, ConfigError
from {{cookiecutter.package_name}}.datasets import prepare, stdlib_sources, token_windows
from {{cookiecutter.package_name}}.datasets import tokens as tokens_module
from {{cookiecutter.package_name}}.datasets.tokenizer import Tokenizer, chosen, find, of_folder, write_ids
from {{cookiecutter.package_name}}.datasets.tokens import prepare_tokens
from {{cookiecutter.package_name}}.tasks import LanguageModel

pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")

VOCAB = 320  # 256 bytes and 64 merges: trains in a fraction of a second


def stdlib_corpus(folder: Path, files: int = 10) -> Path:
    """`files` of the standard library's smaller sources, copied (the split goes by sorted path)."""
    small = [path for path in stdlib_sources() if 2_000 < path.stat().st_size < 12_000][:files]
    folder.mkdir(parents=True)
    for number, path in enumerate(small):
        shutil.copy(path, folder / f"{number:02d}_{path.name}")
    return folder


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory) -> Path:
    """A token folder written with a BPE trained on a small stdlib corpus (every 3rd file validation)."""
    root = tmp_path_factory.mktemp("bpe")
    with pytest.MonkeyPatch.context() as patch:
        said: list[str] = []
        patch.setattr(tokens_module, "say", said.append)
        assert prepare.main(["tokens", str(stdlib_corpus(root / "corpus")), str(root / "tokens"),
                             "--tokenizer", "bpe", "--vocab-size", str(VOCAB), "--val-every", "3"]) == 0  # fmt: skip
    assert said[0].endswith(f"train with data=tokens data.root={root / 'tokens'} model.vocab_size={VOCAB}")
    return root / "tokens"


def test_prepare_trains_a_bpe_and_meta_json_records_it_beside_its_ids(bpe_folder: Path) -> None:
    meta = json.loads((bpe_folder / "meta.json").read_text())
    assert {key: meta[key] for key in ("tokenizer", "vocab_size", "dtype", "tokenizer_file")} == {
        "tokenizer": "bpe", "vocab_size": VOCAB, "dtype": "uint16", "tokenizer_file": "tokenizer.json"}  # fmt: skip
    tokenizer = of_folder(bpe_folder)
    files = sorted((bpe_folder.parent / "corpus").iterdir())
    val_ids = [id_ for path in files[::3] for id_ in tokenizer.encode(path.read_text())]
    stored = torch.from_file(str(bpe_folder / "val.bin"), size=meta["val_tokens"], dtype=torch.uint16)
    assert stored.tolist() == val_ids, "the validation files (every 3rd), encoded one after the other, as uint16"
    train_bytes = sum(path.stat().st_size for number, path in enumerate(files) if number % 3)
    assert meta["train_tokens"] < train_bytes / 1.5, "merges: fewer tokens than bytes"


def test_a_bpe_decodes_what_it_encodes_and_counts_its_bytes(bpe_folder: Path) -> None:
    tokenizer = of_folder(bpe_folder)
    lengths = tokenizer.token_bytes()
    for text in [stdlib_sources()[0].read_text(), "naïve café ✓ 数据 \x00\t\r\n  end", "🙂"]:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert sum(lengths[id_] for id_ in ids) == len(text.encode())
    assert min(lengths) == 1 and max(lengths) > 2 and len(lengths) == VOCAB


def test_a_tokenizer_json_given_is_used_as_it_is(bpe_folder: Path, tmp_path: Path) -> None:
    corpus = bpe_folder.parent / "corpus"
    given = tmp_path / "mine.json"
    shutil.copy(bpe_folder / "tokenizer.json", given)
    meta = prepare_tokens(str(corpus), tmp_path / "again", val_every=3, tokenizer=str(given))
    assert meta["tokenizer"] == "bpe" and meta["vocab_size"] == VOCAB
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "again" / name).read_bytes() == (bpe_folder / name).read_bytes()
    assert find(given).encode("import os") == find(tmp_path / "again").encode("import os")


@pytest.mark.parametrize(
    ("spec", "vocab_size", "message"),
    [
        ("bpe", None, "--tokenizer bpe needs --vocab-size"),
        ("bpe", 200, "needs more than 256 ids"),
        (None, 1000, "--vocab-size is the BPE's"),
        ("nowhere.json", None, "not bytes, bpe, or a tokenizer.json"),
        ("notes", None, "is not a tokenizer.json"),
    ],
)
def test_a_wrong_tokenizer_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, capsys, spec: str | None, vocab_size: int | None, message: str
) -> None:
    (tmp_path / "notes").write_text("not json")
    corpus = stdlib_corpus(tmp_path / "corpus", files=3)
    args = ["tokens", str(corpus), str(tmp_path / "out")]
    args += ["--tokenizer", str(tmp_path / spec) if spec == "notes" else spec] if spec else []
    args += ["--vocab-size", str(vocab_size)] if vocab_size else []
    assert prepare.main(args) == USER_ERROR_EXIT
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1 and not (tmp_path / "out").exists()
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".out")], "no staging folder left"


def test_a_file_that_is_not_utf8_is_refused_for_a_bpe_and_named(tmp_path: Path) -> None:
    corpus = stdlib_corpus(tmp_path / "corpus", files=3)
    (corpus / "zz.bin").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match=r"zz\.bin is not UTF-8 text"):
        prepare_tokens(str(corpus), tmp_path / "out", tokenizer="bpe", vocab_size=VOCAB)
    assert prepare_tokens(str(corpus), tmp_path / "bytes")["tokenizer"] == "bytes", "bytes take any file"


class Wide(Tokenizer):
    """A vocabulary past uint16's 65,536 ids, without training one."""

    vocab_size = 70_000  # type: ignore[assignment]

    def encode(self, text: str) -> list[int]:
        return [69_999, len(text), 65_536]


def test_ids_are_stored_in_the_narrowest_type_their_vocabulary_fits(tmp_path: Path) -> None:
    assert chosen(None, None, []).dtype == "uint8"
    assert [type("V", (Tokenizer,), {"vocab_size": size})().dtype for size in (257, 2**16, 2**16 + 1)] == [
        "uint16", "uint16", "int32"]  # fmt: skip
    corpus = stdlib_corpus(tmp_path / "corpus", files=3)
    counts = write_ids(Wide(), sorted(corpus.iterdir()), tmp_path, val_every=2, repeat=1)
    assert counts == [3, 6]
    stored = torch.from_file(str(tmp_path / "train.bin"), size=3, dtype=torch.int32).tolist()
    assert stored[0] == 69_999 and stored[2] == 65_536


def test_a_tokenizer_json_of_256_ids_or_fewer_writes_its_ids_as_uint8(tmp_path: Path, capsys) -> None:
    """A byte-level BPE with no merges (256 ids): prepare writes uint8 ids that training reads back."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    small = HFTokenizer(models.BPE())
    small.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    small.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # every byte, no merges: 256 ids
    trainer = trainers.BpeTrainer(vocab_size=256, initial_alphabet=alphabet, show_progress=False)
    small.train_from_iterator(["x"], trainer)
    small.save(str(tmp_path / "small.json"))
    corpus = stdlib_corpus(tmp_path / "corpus", files=3)
    args = ["tokens", str(corpus), str(tmp_path / "out"), "--tokenizer", str(tmp_path / "small.json"), "--val-every=3"]
    assert prepare.main(args) == 0, capsys.readouterr().err
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert (meta["tokenizer"], meta["vocab_size"], meta["dtype"]) == ("bpe", 256, "uint8")
    val_ids = find(tmp_path / "small.json").encode(sorted(corpus.iterdir())[0].read_text())
    assert (tmp_path / "out" / "val.bin").read_bytes() == bytes(val_ids), "one byte an id"
    _, val = token_windows(str(tmp_path / "out"), 16, 8, 4, vocab_size=256)
    assert val[0][0].dtype == torch.int64 and len(val) == 4


def test_a_model_whose_vocabulary_is_not_the_tokenizers_is_refused_in_one_line(bpe_folder: Path) -> None:
    with pytest.raises(ConfigError, match=f"model.vocab_size=256, .* have {VOCAB} ids .* set model.vocab_size={VOCAB}"):
        token_windows(str(bpe_folder), 16, 8, 8, vocab_size=256)
    assert len(token_windows(str(bpe_folder), 16, 8, 8, vocab_size=VOCAB)[1]) == 8


def test_a_moved_token_folder_is_refused_naming_the_settings_to_change(bpe_folder: Path, tmp_path: Path) -> None:
    """A checkpoint records its token folder (data.root, task.vocab_from): moved, each refusal names its setting."""
    moved = tmp_path / "moved"
    with pytest.raises(ConfigError) as refused:
        LanguageModel(str(moved))
    assert str(refused.value) == (
        f"task.vocab_from={moved} is not a token folder (no meta.json): give task.vocab_from=<the OUT of prepare "
        "tokens, where it is now>"
    )
    with pytest.raises(ConfigError, match=r"first, or give data.root=<where it is now> \(and task.vocab_from="):
        token_windows(str(moved), 16, 8, 8)
    with pytest.raises(ConfigError, match=f"^tokenizer={tmp_path} is not a token folder"):
        find(tmp_path)
    shutil.copytree(bpe_folder, moved)
    assert LanguageModel(str(moved)).token_bytes is not None


def test_val_bpb_over_bpe_tokens_is_all_the_windows_bits_over_all_the_bytes_they_stand_for(bpe_folder: Path) -> None:
    task, lengths = LanguageModel(str(bpe_folder)), of_folder(bpe_folder).token_bytes()
    tokens = torch.tensor([[256, 300, 10], [300, 301, 302]])
    metrics = task.metrics(torch.zeros(2, 3, VOCAB), tokens)  # uniform: log(VOCAB) nats a token
    means = {name: (total / count).item() for name, (total, count) in metrics.items()}  # (total, count) pairs
    figures = task.summarise(means)
    assert list(figures) == ["loss", "bpb"] and figures["loss"] == pytest.approx(math.log(VOCAB))
    covered = sum(lengths[id_] for id_ in tokens.flatten().tolist())
    assert figures["bpb"] == pytest.approx(6 * math.log2(VOCAB) / covered)
    over_bytes = LanguageModel(None)
    metrics = over_bytes.metrics(torch.zeros(1, 3, 256), torch.tensor([[1, 2, 3]]))
    figures = over_bytes.summarise({name: (total / count).item() for name, (total, count) in metrics.items()})
    assert list(figures) == ["loss", "bpb"] and figures["bpb"] == pytest.approx(8.0), "a byte is a token"


def test_the_language_model_trains_and_evaluates_on_bpe_tokens(
    in_process, monkeypatch, bpe_folder: Path, tmp_path: Path
) -> None:
    overrides = ["task=language_model", "data=tokens", f"data.root={bpe_folder}", f"model.vocab_size={VOCAB}",
                 "data.block_size=16", "data.train_samples=32", "data.val_samples=8", "data.batch_size=16",
                 "model.layers=1", "model.width=16", "model.heads=2", "trainer.epochs=1",
                 f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["train.py", *overrides])
    train_entry.main()
    assert in_process == [0]
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"val_loss", "val_bpb"} <= set(last) and not {"val_bits", "val_bytes"} & set(last)
    _, val = token_windows(str(bpe_folder), 16, 32, 8)
    lengths = of_folder(bpe_folder).token_bytes()
    covered = sum(lengths[id_] for index in range(8) for id_ in val[index][1].tolist())  # the targets' bytes
    assert last["val_bpb"] == pytest.approx(last["val_loss"] * 8 * 16 / math.log(2) / covered, rel=1e-9)
    assert covered > 8 * 16, "BPE tokens stand for more than a byte each: val_bpb is not bits per token"
