#!/usr/bin/env bash
# Join a job across several machines: the same command on every node, each with its NODE_RANK.
#
#   bash scripts/run_multi.sh NODE_RANK=1 [NNODES=2] [MASTER_ADDR=node001] [KEY=VALUE ...] [Hydra overrides ...]
#   bash scripts/run_multi.sh --help                                  # the keys and their defaults
#
# NNODES=N is static (exactly N nodes); NNODES=MIN:MAX is elastic (nodes may join and leave).
# Keys a scheduler sets in the environment (NODE_RANK, MASTER_ADDR, MASTER_PORT, NNODES,
# torchrun's PET_*) are used when the command line does not give them; scripts/cluster.env holds
# this cluster's defaults. The launch logic is Python: {{ cookiecutter.package_name }}/launch/ (python -m {{ cookiecutter.package_name }}.launch).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m {{ cookiecutter.package_name }}.launch multi "$@"
