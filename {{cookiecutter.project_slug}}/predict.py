"""Write a checkpoint's model's outputs over a data set, on any number of processes.

    python predict.py ckpt_path=outputs/<run>/checkpoints/step_00000256.pt out=predictions.pt
    torchrun --standalone --nproc_per_node=3 predict.py ckpt_path=... out=... split=train predict_as=class

The file holds {"indices": (N,), "outputs": (N, ...)}, ordered by sample index, the same at any number
of processes. The entry point lives in the package ({{ cookiecutter.package_name }}/predict.py).
"""

from {{cookiecutter.package_name}}.predict import main

if __name__ == "__main__":
    main()
