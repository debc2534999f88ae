"""datasets/corpus.py: a corpus of local files read into memory, split by file, windows drawn per sample."""

from __future__ import annotations

import torch

from {{cookiecutter.package_name}}.datasets import stdlib_sources, text


def test_text_splits_the_corpus_by_file_and_draws_windows_per_sample() -> None:
    files = stdlib_sources()
    assert len(files) > 100 and all(path.suffix == ".py" for path in files)
    train, val = text(None, block_size=64, train_samples=10, val_samples=5)
    assert len(train.data) > 3 * len(val.data) > 0, "every 10th file is validation"
    from {{cookiecutter.package_name}}.randomness import building_sample

    with building_sample(0, 1, 3):
        x, y = train[3]
    with building_sample(0, 1, 3):
        again, _ = train[3]
    with building_sample(0, 2, 3):
        other, _ = train[3]
    assert x.shape == y.shape == (64,) and torch.equal(x[1:], y[:-1])
    assert torch.equal(x, again) and not torch.equal(x, other), "a window is a function of (seed, epoch, index)"
    assert torch.equal(val[2][0], val[2][0])
