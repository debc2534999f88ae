"""datasets/corpus.py: a corpus of local files read into memory, split by file, windows drawn per sample."""

from __future__ import annotations

from pathlib import Path

import torch

from {{cookiecutter.package_name}}.datasets import stdlib_sources, text, text_files


def test_text_splits_the_corpus_by_file_and_draws_windows_per_sample() -> None:
    files = stdlib_sources()
    assert len(files) > 100 and all(path.suffix == ".py" for path in files)
    train, val = text(None, block_size=64, train_samples=10, val_samples=5)
    assert len(train.data) > 3 * len(val.data) > 0, "every 10th file is validation"
    from {{cookiecutter.package_name}}.datasets.randomness import building_sample

    with building_sample(0, 1, 3):
        x, y = train[3]
    with building_sample(0, 1, 3):
        again, _ = train[3]
    with building_sample(0, 2, 3):
        other, _ = train[3]
    assert x.shape == y.shape == (64,) and torch.equal(x[1:], y[:-1])
    assert torch.equal(x, again) and not torch.equal(x, other), "a window is a function of (seed, epoch, index)"
    assert torch.equal(val[2][0], val[2][0])


def test_the_corpus_leaves_out_prepared_data_inside_it(tmp_path: Path) -> None:
    for path in ("a.txt", "sub/b.txt", "tokens/meta.json", "tokens/train.bin", "tokens/val.bin", "shards/index.json",
                 "shards/train-00000.pt", "shards/x/deep.txt", ".tokens.prepare-1a2b/train.bin", "out/c.txt",
                 "notes/meta.json", "notes/index.json"):  # fmt: skip
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("text")
    expected = ["a.txt", "notes/index.json", "notes/meta.json", "sub/b.txt"]
    found = text_files(str(tmp_path), exclude=(tmp_path / "out",))
    assert [str(path.relative_to(tmp_path)) for path in found] == expected
    assert [str(path.relative_to(tmp_path)) for path in text_files(f"{tmp_path}/**/*.*")] == [
        "a.txt", "notes/index.json", "notes/meta.json", "out/c.txt", "sub/b.txt"]  # fmt: skip
