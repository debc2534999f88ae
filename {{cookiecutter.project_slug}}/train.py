"""Train: `python train.py [overrides]` (one process) or `bash scripts/run_single.sh` (torchrun).

The entry point lives in the package ({{ cookiecutter.package_name }}/train.py), so that it also works
installed (`{{ cookiecutter.package_name }}-train`, `torchrun -m {{ cookiecutter.package_name }}.train`).
"""

from {{cookiecutter.package_name}}.train import main

if __name__ == "__main__":
    main()
