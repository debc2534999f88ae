"""datasets/tokens.py: a corpus prepared into token files (data=text's split, streamed, written atomically)
and trained on from their memory maps, window for window as data=text."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from {{cookiecutter.package_name}} import train as train_entry
from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.run_dir import FINISHED_MARKER
from {{cookiecutter.package_name}}.datasets import text, token_windows
from {{cookiecutter.package_name}}.datasets import tokens as tokens_module
from {{cookiecutter.package_name}}.datasets.prepare import main
from {{cookiecutter.package_name}}.datasets.randomness import building_sample
from {{cookiecutter.package_name}}.datasets.tokens import prepare_tokens

from ..helpers import record_fsyncs

pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")


def write_corpus(folder: Path, files: int = 12, seed: int = 0) -> Path:
    """`files` files of 100 to 400 random bytes, in two subfolders (the split goes by sorted path)."""
    rng = np.random.default_rng(seed)
    for number in range(files):
        path = folder / f"part_{number % 2}" / f"file_{number:02d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.integers(0, 256, int(rng.integers(100, 400)), dtype=np.uint8).tobytes())
    return folder


def windows(dataset, indices) -> list[torch.Tensor]:  # noqa: ANN001
    out = []
    for index in indices:
        with building_sample(0, 1, index):
            x, y = dataset[index]
        out.append(torch.cat([x, y[-1:]]))
    return out


def assert_same_windows(ours, theirs) -> None:  # noqa: ANN001
    for mine, reference in zip(ours, theirs, strict=True):
        assert len(mine) == len(reference) and mine.random_offsets == reference.random_offsets
        assert torch.equal(mine.data, reference.data)
        indices = range(len(reference))
        assert all(map(torch.equal, windows(mine, indices), windows(reference, indices)))


def test_prepared_tokens_give_the_windows_of_data_text_for_the_same_corpus(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    meta = prepare_tokens(str(corpus), tmp_path / "tokens")
    files = sorted(path for path in corpus.rglob("*") if path.is_file())
    val_bytes = files[0].read_bytes() + files[10].read_bytes()  # every 10th by sorted path
    assert (tmp_path / "tokens" / "val.bin").read_bytes() == val_bytes
    assert json.loads((tmp_path / "tokens" / "meta.json").read_text()) == meta
    assert meta["tokenizer"] == "bytes" and meta["vocab_size"] == 256 and meta["dtype"] == "uint8"
    assert meta["val_tokens"] == len(val_bytes) and meta["files"] == 12
    assert meta["train_tokens"] == sum(path.stat().st_size for path in files) - len(val_bytes)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus", "tokens"], "nothing left beside it"
    ours = token_windows(str(tmp_path / "tokens"), block_size=16, train_samples=20, val_samples=7)
    assert_same_windows(ours, text(str(corpus), block_size=16, train_samples=20, val_samples=7))


def test_repeat_reads_as_a_folder_of_copies_of_the_corpus(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    for copy in ("copy_0", "copy_1"):  # 24 files numbered on: the 10th and 20th fall in other places than 2 x 12
        for path in corpus.rglob("*.txt"):
            target = tmp_path / "copies" / copy / path.relative_to(corpus)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
    meta = prepare_tokens(str(corpus), tmp_path / "tokens", repeat=2)
    assert meta["files"] == 24 and meta["repeat"] == 2
    ours = token_windows(str(tmp_path / "tokens"), block_size=16, train_samples=20, val_samples=7)
    assert_same_windows(ours, text(str(tmp_path / "copies"), block_size=16, train_samples=20, val_samples=7))


def test_the_map_opens_in_each_process_on_its_first_window_and_is_never_pickled(tmp_path: Path) -> None:
    prepare_tokens(str(write_corpus(tmp_path / "corpus")), tmp_path / "tokens")
    train, _ = token_windows(str(tmp_path / "tokens"), block_size=16, train_samples=20, val_samples=7)
    assert train.mapped is None, "nothing is opened by building the set (the launcher's checks, the main process)"
    shipped = pickle.dumps(train)
    first = windows(train, [3])
    assert train.mapped is not None
    assert len(pickle.dumps(train)) == len(shipped) < 1000, "a DataLoader worker gets the path, not the tokens"
    worker_copy = pickle.loads(pickle.dumps(train))
    assert worker_copy.mapped is None and torch.equal(windows(worker_copy, [3])[0], first[0])


def test_an_existing_folder_is_refused_unless_forced_and_a_failed_write_leaves_it_as_it_was(
    tmp_path: Path, monkeypatch
) -> None:
    corpus, out = str(write_corpus(tmp_path / "corpus")), tmp_path / "tokens"
    first = prepare_tokens(corpus, out)
    with pytest.raises(ConfigError, match="tokens exists: pass --force"):
        prepare_tokens(corpus, out, repeat=2)

    def fails_half_way(*args) -> list[int]:  # noqa: ANN002
        real_write(*args)
        raise OSError("disk full")

    real_write = tokens_module.write_splits
    monkeypatch.setattr(tokens_module, "write_splits", fails_half_way)
    with pytest.raises(OSError, match="disk full"):
        prepare_tokens(corpus, out, repeat=2, force=True)
    assert json.loads((out / "meta.json").read_text()) == first, "the old folder untouched"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus", "tokens"], "no half-written folder left"
    monkeypatch.undo()
    again = prepare_tokens(corpus, out, repeat=2, force=True)
    assert again["train_tokens"] + again["val_tokens"] == 2 * (first["train_tokens"] + first["val_tokens"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus", "tokens"], "the old one removed"


def test_a_folder_prepare_did_not_write_is_refused_in_one_line_that_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no meta.json\): run `python -m .*datasets.prepare tokens CORPUS"):
        token_windows(str(tmp_path / "missing"), block_size=16, train_samples=20, val_samples=7)
    out = tmp_path / "tokens"
    prepare_tokens(str(write_corpus(tmp_path / "corpus")), out)
    with pytest.raises(ConfigError, match="block_size=4000 is longer than"):
        token_windows(str(out), block_size=4000, train_samples=20, val_samples=7)
    with open(out / "train.bin", "r+b") as file:
        file.truncate(100)  # a copy cut short
    with pytest.raises(ConfigError, match=r"train.bin holds 100 bytes.*CORPUS .*tokens --force` again$") as refused:
        token_windows(str(out), block_size=16, train_samples=20, val_samples=7)
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="found 1 file"):
        prepare_tokens(str(tmp_path / "corpus" / "part_0" / "file_00.*"), tmp_path / "other")
    with pytest.raises(ConfigError, match="is not a folder, a glob pattern or 'stdlib'"):
        prepare_tokens(str(tmp_path / "corpus" / "part_0" / "file_00.txt"), tmp_path / "other")


def test_a_killed_prepare_leaves_a_hidden_folder_the_next_one_removes_but_never_one_in_use(tmp_path: Path) -> None:
    corpus, out = str(write_corpus(tmp_path / "corpus")), tmp_path / "tokens"
    killed = (f"import os; from {tokens_module.__name__} import prepare_tokens; import {tokens_module.__name__} as t; "
              "t.write_splits = lambda files, folder, *rest: ((folder / 'train.bin').write_bytes(b'half'), "
              f"os._exit(9)); prepare_tokens({corpus!r}, __import__('pathlib').Path({str(out)!r}))")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", killed], cwd=os.getcwd()).returncode == 9  # as a kill -9 ends it
    (litter,) = [path for path in tmp_path.iterdir() if path.name.startswith(".tokens.prepare-")]
    assert (litter / "train.bin").read_bytes() == b"half", "what the issue found: a half-written folder"
    running, lock = tokens_module.locked_folder(out)  # another prepare's, still writing
    try:
        prepare_tokens(corpus, out)
        assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["corpus", "tokens", running.name])
    finally:
        os.close(lock)


def test_out_inside_the_corpus_is_not_read_back_and_the_folder_gets_the_usual_modes(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    mask = os.umask(0o022)
    try:
        first = prepare_tokens(str(corpus), corpus / "tokens")
        second = prepare_tokens(str(corpus), corpus / "tokens", force=True)
    finally:
        os.umask(mask)
    assert (second["train_tokens"], second["files"]) == (first["train_tokens"], 12), "the first OUT not folded in"
    assert [oct(path.stat().st_mode & 0o777) for path in sorted([corpus / "tokens", *(corpus / "tokens").iterdir()])] \
        == ["0o755", "0o644", "0o644", "0o644"], "the umask's modes, as any folder a user writes"  # fmt: skip
    prepare_tokens(str(corpus), tmp_path / "elsewhere")
    assert prepare_tokens(str(corpus / "**"), corpus / "again")["train_tokens"] == first["train_tokens"], "nor by glob"


def test_a_corpus_of_empty_files_or_an_empty_split_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for number in range(3):
        (corpus / f"{number}.txt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"its 3 files are all empty: give a corpus of text$"):
        prepare_tokens(str(corpus), tmp_path / "tokens")
    (corpus / "1.txt").write_bytes(b"text " * 50)  # training holds it; validation (file 0) holds nothing
    with pytest.raises(ConfigError, match=r"its validation split \(every 10th file by path is validation\) would"):
        prepare_tokens(str(corpus), tmp_path / "tokens")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus"]


def test_each_prepare_gives_the_folder_a_new_id_a_checkpoint_records(tmp_path: Path) -> None:
    corpus, out = str(write_corpus(tmp_path / "corpus")), tmp_path / "tokens"
    first = prepare_tokens(corpus, out)
    train, val = token_windows(str(out), block_size=16, train_samples=20, val_samples=7)
    assert train.prepared == val.prepared == {"root": str(out), "id": first["id"]}
    again = prepare_tokens(corpus, out, force=True)  # the same corpus, the same sizes: still another preparation
    assert token_windows(str(out), 16, 20, 7)[0].prepared["id"] == again["id"] != first["id"]
    del again["id"]
    (out / "meta.json").write_text(json.dumps(again))  # a folder of before the id: its meta.json's hash
    older = token_windows(str(out), 16, 20, 7)[0].prepared["id"]
    assert older == token_windows(str(out), 16, 20, 7)[0].prepared["id"] and len(older) == 32


def test_the_language_model_trains_on_token_files(in_process, monkeypatch, tmp_path: Path, capsys) -> None:
    prepare_tokens(str(write_corpus(tmp_path / "corpus", files=24)), tmp_path / "tokens")
    overrides = ["task=language_model", "data=tokens", f"data.root={tmp_path / 'tokens'}", "data.block_size=16",
                 "data.train_samples=32", "data.val_samples=8", "data.batch_size=16", "model.layers=1",
                 "model.width=16", "model.heads=2", "trainer.epochs=1",
                 f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["train.py", *overrides])
    train_entry.main()
    assert in_process == [0]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "val" and records[-1]["val_samples"] == 8
    assert (tmp_path / "run" / FINISHED_MARKER).read_text().strip() == "2", "2 steps of 16 windows"
    prepare_tokens(str(write_corpus(tmp_path / "other", files=24, seed=1)), tmp_path / "tokens", force=True)
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["train.py", *overrides, "trainer.epochs=2"])  # go on, on other data
    with pytest.raises(SystemExit) as stopped:
        train_entry.main()
    assert stopped.value.code == 2 and in_process == [0]
    err = capsys.readouterr().err
    assert f"data.root={tmp_path / 'tokens'} was prepared again since the checkpoint was written" in err, err
    assert "checkpoint.allow_changes=[data.root]" in err
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == len(records), "nothing trained"


def test_the_token_files_reach_the_disk_before_the_folder_is_renamed_into_place(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(os, "fsync", os.fsync)  # given back after the test
    synced = record_fsyncs()
    prepare_tokens(str(write_corpus(tmp_path / "corpus")), tmp_path / "tokens")
    assert {Path(path).name for path in synced} >= {"train.bin", "val.bin"}, synced
    assert all(Path(path).parent != tmp_path / "tokens" for path in synced), "while still in the hidden folder"


def resident_kib(path: Path) -> int:
    """The pages of `path`'s maps in this process that are resident (its Rss lines in /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's first line: address range ... path
            inside = head[-1] == str(path)
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


def test_windows_read_only_their_own_pages_of_the_map(tmp_path: Path) -> None:
    """A rank's windows bring in their own pages of the file and no more: no readahead around each page
    fault (read_ahead_kb, 8 MiB on some disks), no neighbours mapped in with it. 64 windows spread over
    a 16 MiB file, read from disk (the page cache dropped first), leave a few hundred KiB resident."""
    path = tmp_path / "train.bin"
    with open(path, "wb") as file:
        file.write(np.random.default_rng(0).integers(0, 256, 2**24, dtype=np.uint8).tobytes())
        file.flush()
        os.fsync(file.fileno())  # clean pages: fadvise can drop them
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    dataset = tokens_module.TokenWindows(path, 2**24, "uint8", block_size=256, samples=64, random_offsets=False)
    for index in range(64):
        dataset[index]
    page_kib = os.sysconf("SC_PAGESIZE") // 1024
    assert 0 < resident_kib(path) <= 64 * 2 * page_kib, "at most the two pages each window spans"


def test_prepare_tokens_as_a_command_writes_the_folder_and_refuses_to_overwrite_it_in_one_line(
    tmp_path: Path, capsys
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for number in range(3):
        (corpus / f"{number}.txt").write_text(f"file {number} " * 20)
    out = tmp_path / "tokens"
    assert main(["tokens", str(corpus), str(out), "--val-every", "3", "--repeat", "2"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["files"], meta["repeat"], meta["val_every"]) == (6, 2, 3)
    assert meta["val_tokens"] == 2 * len("file 0 " * 20), "files 0 and 3 of 0 1 2 0 1 2"
    assert f"train with data=tokens data.root={out}" in capsys.readouterr().out
    assert main(["tokens", str(corpus), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--force" in err and err.count("\n") == 1, err
    assert main(["tokens", str(corpus), str(out), "--force"]) == 0
    assert json.loads((out / "meta.json").read_text())["repeat"] == 1
