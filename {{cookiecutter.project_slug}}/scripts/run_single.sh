#!/usr/bin/env bash
# Train on this machine with torchrun: one process per visible GPU (without one: one process, a thread per core).
#
#   bash scripts/run_single.sh [KEY=VALUE ...] [Hydra flags and overrides ...] [-- torchrun flags ...]
#   bash scripts/run_single.sh --help                                 # the keys and their defaults
#   bash scripts/run_single.sh trainer.epochs=10 model=resnet18
#   bash scripts/run_single.sh RUN_DIR=outputs/2026-01-01_12-00-00   # continue that run
{%- if cookiecutter.sweeps == "yes" %}
#   bash scripts/run_single.sh -m optim.lr=0.1,0.05                  # a sweep: one job per point
{%- endif %}
#
# The launch logic is Python: {{ cookiecutter.package_name }}/launch/ (python -m {{ cookiecutter.package_name }}.launch).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m {{ cookiecutter.package_name }}.launch single "$@"
