"""Evaluate a checkpoint exactly, on any number of processes.

    python eval.py ckpt_path=outputs/<run>/checkpoints/step_00000256.pt
    torchrun --standalone --nproc_per_node=3 eval.py ckpt_path=...

The last line of the output is `val_loss=<float> val_acc=<float> val_samples=<int>`.
"""

import sys

import hydra
from omegaconf import DictConfig

from {{cookiecutter.package_name}}.entry import prepare, run_eval


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    run_eval(cfg)


if __name__ == "__main__":
    prepare(sys.argv)  # accepts the legacy --local-rank argument, registers the config schema
    main()
