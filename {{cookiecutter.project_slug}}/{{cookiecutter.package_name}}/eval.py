"""Evaluate a checkpoint exactly, on any number of processes:
`python -m {{ cookiecutter.package_name }}.eval ckpt_path=...`, `torchrun -m {{ cookiecutter.package_name }}.eval ...`,
or `{{ cookiecutter.package_name }}-eval ckpt_path=...` once installed."""

import sys

import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

from .config import config_dir
from .entry import prepare, run_eval


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="eval")
@record
def evaluate_checkpoint(cfg: DictConfig) -> None:
    run_eval(cfg)


def main() -> None:
    prepare(sys.argv)
    evaluate_checkpoint()


if __name__ == "__main__":
    main()
