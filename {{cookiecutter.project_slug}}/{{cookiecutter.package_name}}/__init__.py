"""{{ cookiecutter.project_name }}: distributed training with torchrun, DDP and Hydra."""
