"""Refuse names that would make a broken project, before cookiecutter writes any file.

The project slug becomes a folder and the package name an importable package, so both must
be Python identifiers that are not keywords and do not shadow a module the project imports.
"""

import keyword
import sys

# Filled in by cookiecutter before this hook runs.
VALUES = {
    "project_slug": "{{ cookiecutter.project_slug }}",
    "package_name": "{{ cookiecutter.package_name }}",
}
DEFAULT_TASK, LANGUAGE_MODEL = "{{ cookiecutter.default_task }}", "{{ cookiecutter.language_model }}"

# What the generated project imports or holds at its top level, beside the standard library.
TAKEN = {
    "torch",
    "torchvision",
    "hydra",
    "omegaconf",
    "tqdm",
    "numpy",
    "mlflow",
    "wandb",
    "PIL",
    "yaml",
    "cookiecutter",
    "pytest",
    "setuptools",
    "test",
    "tests",
    "configs",
    "scripts",
    "outputs",
    "train",
    "eval",
    "predict",
    "data",
}


def problem(name: str) -> str | None:
    if not name.isidentifier() or not name.isascii():
        return "is not a valid Python identifier"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return "is a Python keyword"
    if name in TAKEN or name in sys.stdlib_module_names:
        return "would shadow a module the project imports"
    return None


def main() -> int:
    for key, value in VALUES.items():
        reason = problem(value)
        if reason:
            print(
                f"error: {key}={value!r} {reason}; use lower_case letters, digits and underscores, "
                "starting with a letter (e.g. my_project)",
                file=sys.stderr,
            )
            return 1
    if DEFAULT_TASK == "language_model" and LANGUAGE_MODEL == "no":
        print("error: default_task=language_model needs language_model=yes: choose one of them "
              "(language_model=no leaves default_task=image_classification alone)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
