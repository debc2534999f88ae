#!/usr/bin/env bash
# Check the communication before a long job: every collective training relies on, each rank's
# host, local rank and device, all_reduce bus bandwidth by message size, and a PASS/FAIL table.
#
#   bash scripts/check_comm.sh [KEY=VALUE ...] [dist.backend=...]
#
# One node: the keys of run_single.sh (NPROC_PER_NODE). Several nodes: the keys of
# run_multi.sh, NODE_RANK=<n> on every node, as for training. Exit code 0 when all passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m {{ cookiecutter.package_name }}.launch comm "$@"
