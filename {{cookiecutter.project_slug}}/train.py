"""Train: `python train.py [overrides]` (one process) or `bash scripts/run_single.sh` (torchrun)."""

import sys

import hydra
from omegaconf import DictConfig

from {{cookiecutter.package_name}}.config import register_configs
from {{cookiecutter.package_name}}.entry import accept_legacy_local_rank, run_train
from {{cookiecutter.package_name}}.rundir import register_resolvers


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    run_train(cfg)


if __name__ == "__main__":
    accept_legacy_local_rank(sys.argv)
    register_configs()
    register_resolvers()
    main()
