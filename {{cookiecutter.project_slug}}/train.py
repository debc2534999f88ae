"""Train: `python train.py [overrides]` (one process) or `bash scripts/run_single.sh` (torchrun)."""

import sys

import hydra
from omegaconf import DictConfig

from {{cookiecutter.package_name}}.entry import prepare, run_train


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    run_train(cfg)


if __name__ == "__main__":
    prepare(sys.argv)  # accepts the legacy --local-rank argument, registers the config schema
    main()
