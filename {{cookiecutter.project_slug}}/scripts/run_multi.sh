#!/usr/bin/env bash
# Join a job across several machines: the same command on every node, each with its NODE_RANK.
#
#   bash scripts/run_multi.sh NODE_RANK=1 [NNODES=2] [NPROC_PER_NODE=...] [MASTER_ADDR=...] \
#     [MASTER_PORT=29500] [RUN_NAME=...] [MAX_RESTARTS=...] [Hydra overrides ...]
#
# NNODES=N        static: exactly N nodes (torchrun --nnodes --node-rank --master-addr --master-port)
# NNODES=MIN:MAX  elastic: c10d rendezvous at MASTER_ADDR:MASTER_PORT, id RUN_NAME; nodes may
#                 join and leave, the job restarts with the new world and resumes its checkpoint
# NPROC_PER_NODE  processes per node (default: the visible GPUs, or 2 without one)
# GPUS            this node's GPUs, e.g. GPUS=0,1,2,3: CUDA_VISIBLE_DEVICES, one process per GPU
# MASTER_ADDR     node 0's address, reachable from every node (required on nodes other than 0)
# MASTER_PORT     a free port on node 0 (29500)
# RUN_NAME        the run dir is outputs/RUN_NAME on every node; default multi_<MASTER_ADDR>_<MASTER_PORT>,
#                 so every node computes the same name, and launching again continues that run
# MAX_RESTARTS    worker restarts torchrun allows (3); each resumes from the newest checkpoint
# LOCAL_ADDR      this node's address, where its hostname does not resolve to it (optional)
# WAIT_FOR_MASTER_S  how long nodes other than 0 wait for node 0's port (120)
#
# Defaults come from scripts/cluster.env when it exists (edit it once for a cluster), and
# KEY=VALUE arguments override them. Anything lower case is a Hydra override for train.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

multi_node_defaults
parse_keys "$MULTI_NODE_KEYS" "$@"
apply_gpus
[[ -n "$NPROC_PER_NODE" ]] || NPROC_PER_NODE="$(default_nproc)"
check_multi_node_keys

cd "$PROJECT_DIR"
RUN_DIR="outputs/$RUN_NAME"
check_launch "$NPROC_PER_NODE" "$RUN_DIR"
multi_node_args
echo "run dir: $RUN_DIR (node $NODE_RANK)"
status=0
run_torchrun "${TORCHRUN_ARGS[@]}" train.py hydra.run.dir="$RUN_DIR" "${HYDRA_ARGS[@]}" \
  || status=$?
echo "run dir: $RUN_DIR (node $NODE_RANK)"
exit "$status"
