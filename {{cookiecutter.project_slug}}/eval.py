"""Evaluate a checkpoint exactly, on any number of processes.

    python eval.py ckpt_path=outputs/<run>/checkpoints/step_00000256.pt
    torchrun --standalone --nproc_per_node=3 eval.py ckpt_path=...

The last line of the output is the task's metrics, `val_loss=<float> val_acc=<float> val_samples=<int>`
for classification. The entry point lives in the package ({{ cookiecutter.package_name }}/eval.py).
"""

from {{cookiecutter.package_name}}.eval import main

if __name__ == "__main__":
    main()
