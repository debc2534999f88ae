"""Evaluate a checkpoint exactly, on any number of processes:
`python -m {{ cookiecutter.package_name }}.eval ckpt_path=...`, `torchrun -m {{ cookiecutter.package_name }}.eval ...`,
or `{{ cookiecutter.package_name }}-eval ckpt_path=...` once installed."""

import sys

import hydra
from omegaconf import DictConfig

from .common.processes import exit_now
from .config import config_dir, let_group_keys_through
from .engine.assembly.entry import prepare, record, run_eval


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="eval")
@record
def evaluate_checkpoint(cfg: DictConfig) -> None:
    run_eval(cfg)


def main() -> None:
    """The process's entry (console script, `python -m`, eval.py beside the package)."""
    prepare(sys.argv)
    let_group_keys_through(sys.argv)  # data.val_size=5 goes to the checkpoint's data group
    evaluate_checkpoint()
    exit_now(0)  # evaluated and printed: no seconds of interpreter teardown


if __name__ == "__main__":
    main()
