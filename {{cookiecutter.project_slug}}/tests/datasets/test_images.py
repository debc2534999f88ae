"""datasets/images.py: the built-in image sets, read from their own formats; trees that would fail mid-epoch
refused."""

from __future__ import annotations

import os

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.components import build_datasets
from {{cookiecutter.package_name}}.engine.data.loader import build_data

from ..helpers import compose_config, cpu_env, write_cifar, write_image_tree


def test_synthetic_set_is_made_from_the_seed() -> None:
    def made(seed: int):
        overrides = ["data=synthetic", "data.train_size=50", "data.val_size=20", f"seed={seed}"]
        return build_datasets(to_train_config(compose_config(overrides)).data.dataset)

    (a, _), (b, _), (c, _) = made(0), made(0), made(1)
    assert torch.equal(a.images, b.images) and not torch.equal(a.images, c.images)
    assert len(set(a.labels.tolist())) > 2


def test_image_folder_reads_a_local_tree(tmp_path) -> None:
    write_image_tree(tmp_path, classes=3, per_class=4)
    overrides = [
        "data=image_folder",
        f"data.root={tmp_path}",
        "data.num_classes=3",
        "data.image_size=16",
        "data.num_workers=0",
    ]
    config = to_train_config(compose_config(overrides))
    data = build_data(config.data, cpu_env(0, 1), seed=0)
    images, labels, weights, indices = next(iter(data.train_loader))
    assert images.shape[1:] == (3, 16, 16) and set(labels.tolist()) <= {0, 1, 2}
    assert data.val_size == 12 and weights.tolist() == [1.0] * len(indices)


def test_image_folder_class_count_mismatch_is_a_clear_error(tmp_path) -> None:
    write_image_tree(tmp_path, classes=3, per_class=1)
    config = to_train_config(compose_config(["data=image_folder", f"data.root={tmp_path}"]))
    with pytest.raises(ConfigError, match="data.num_classes=10"):
        build_datasets(config.data.dataset)


def test_cifar10_reads_its_own_format(tmp_path) -> None:
    write_cifar(tmp_path, per_file=6)
    config = to_train_config(compose_config(["data=cifar10", f"data.root={tmp_path}"]))
    train, val = build_datasets(config.data.dataset)
    assert (len(train), len(val)) == (30, 6)
    image, label = train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and 0 <= label < 10


def test_a_doctored_cifar10_file_runs_nothing_and_is_refused_in_one_line(tmp_path) -> None:
    """A pickle may name any callable: only what CIFAR-10's format holds is built from one."""
    import pickle

    from {{cookiecutter.package_name}}.datasets.images import read_cifar_batches

    class Payload:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    write_cifar(tmp_path, per_file=2)
    folder = tmp_path / "cifar-10-batches-py"
    with open(folder / "test_batch", "wb") as file:
        pickle.dump({"data": Payload(), "labels": [0]}, file)
    assert len(read_cifar_batches(folder, ["data_batch_1"]).labels) == 2, "the genuine format reads"
    with pytest.raises(ConfigError) as error:
        read_cifar_batches(folder, ["test_batch"])
    said = f"{folder / 'test_batch'}: not CIFAR-10's python format (posix.system is not part of CIFAR-10's format)"
    assert str(error.value) == said + ": fetch it again"
    assert not (tmp_path / "ran").exists()


def test_cifar10_missing_says_where_and_does_not_download(tmp_path) -> None:
    config = to_train_config(compose_config(["data=cifar10", f"data.root={tmp_path}"]))
    with pytest.raises(ConfigError, match="cifar-10-batches-py.*data.download=true"):
        build_datasets(config.data.dataset)
    assert not any(tmp_path.iterdir()), "nothing may be downloaded unless asked"


@pytest.mark.parametrize("fault", ["empty class folder", "empty file", "class count"])
def test_an_image_tree_that_would_fail_mid_epoch_is_refused_naming_the_folder_or_file(tmp_path, fault: str) -> None:
    write_image_tree(tmp_path, classes=3, per_class=2)
    if fault == "empty class folder":
        (tmp_path / "val" / "class_4").mkdir()
        (tmp_path / "train" / "class_4").mkdir()
        for image in (tmp_path / "val" / "class_4").glob("*"):
            image.unlink()
        (tmp_path / "train" / "class_4" / "1.png").write_bytes((tmp_path / "train" / "class_0" / "0.png").read_bytes())
        expected, classes = f"{tmp_path / 'val' / 'class_4'} holds no images", 4
    elif fault == "empty file":
        (tmp_path / "train" / "class_1" / "0.png").write_bytes(b"")
        expected, classes = f"{tmp_path / 'train' / 'class_1' / '0.png'} is an empty file", 3
    else:
        expected, classes = f"{tmp_path / 'train'} has 3 class folders, data.num_classes=5", 5
    overrides = ["data=image_folder", f"data.root={tmp_path}", f"data.num_classes={classes}"]
    config = to_train_config(compose_config(overrides))
    with pytest.raises(ConfigError) as error:
        build_datasets(config.data.dataset)
    assert expected in str(error.value) and "\n" not in str(error.value)
