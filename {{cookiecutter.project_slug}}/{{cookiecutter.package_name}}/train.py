"""Train with the composed config: `python -m {{ cookiecutter.package_name }}.train [overrides]` (one process),
`torchrun -m {{ cookiecutter.package_name }}.train ...`, or `{{ cookiecutter.package_name }}-train` once installed."""

import sys

import hydra
from omegaconf import DictConfig

from .common.processes import exit_now
from .config import config_dir
from .engine.assembly.entry import prepare, record, run_train


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")
@record  # a real bug: torchrun's failure summary names the rank and shows its traceback
def train(cfg: DictConfig) -> None:
    run_train(cfg)


def main() -> None:
    """The process's entry (console script, `python -m`, train.py beside the package)."""
    prepare(sys.argv)  # accepts the legacy --local-rank argument, registers the config schema
    train()
    exit_now(0)  # trained and written: no seconds of interpreter teardown


if __name__ == "__main__":
    main()
