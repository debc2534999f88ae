#!/usr/bin/env bash
# Check the communication before a long job: every collective training relies on, each rank's
# host, local rank and device, all_reduce bus bandwidth by message size, and a PASS/FAIL table.
#
#   bash scripts/check_comm.sh [KEY=VALUE ...] [dist.backend=...]
#
# One node: the keys of run_single.sh (NPROC_PER_NODE). Several nodes: the keys of
# run_multi.sh, NODE_RANK=<n> on every node, as for training. Exit code 0 when all passed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

multi_node_defaults
MAX_RESTARTS=0
parse_keys "$MULTI_NODE_KEYS" "$@"
apply_gpus
[[ -n "$NPROC_PER_NODE" ]] || NPROC_PER_NODE="$(default_nproc)"
cd "$PROJECT_DIR"
if [[ -n "$NODE_RANK" ]]; then
  check_multi_node_keys
  multi_node_args
else
  require_int NPROC_PER_NODE "$NPROC_PER_NODE" 1
  TORCHRUN_ARGS=(--standalone --nproc-per-node="$NPROC_PER_NODE")
fi
run_torchrun "${TORCHRUN_ARGS[@]}" -m {{ cookiecutter.package_name }}.comm_check "${HYDRA_ARGS[@]}"
