#!/usr/bin/env bash
# Train on this machine with torchrun: one process per visible GPU (2 on a machine without one).
#
#   bash scripts/run_single.sh [KEY=VALUE ...] [Hydra overrides ...]
#
# KEY=VALUE (upper case):
#   NPROC_PER_NODE  processes on this machine   (default: the visible GPUs, or 2 without one)
#   GPUS            the GPUs to use, e.g. GPUS=0,1,2,3: CUDA_VISIBLE_DEVICES, and one process per GPU
#   MAX_RESTARTS    times torchrun restarts failed workers; they resume from the newest checkpoint (3)
#   RUN_DIR         the run dir (default: a new outputs/<date>_<time>); an existing one is resumed
# Examples:
#   bash scripts/run_single.sh trainer.epochs=10 model=resnet18
#   bash scripts/run_single.sh RUN_DIR=outputs/2026-01-01_12-00-00     # continue that run
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NPROC_PER_NODE="" GPUS="" MAX_RESTARTS=3 RUN_DIR=""
parse_keys "NPROC_PER_NODE GPUS MAX_RESTARTS RUN_DIR" "$@"
apply_gpus
[[ -n "$NPROC_PER_NODE" ]] || NPROC_PER_NODE="$(default_nproc)"
require_int NPROC_PER_NODE "$NPROC_PER_NODE" 1
require_int MAX_RESTARTS "$MAX_RESTARTS" 0

cd "$PROJECT_DIR"
check_launch "$NPROC_PER_NODE" "$RUN_DIR"
[[ -n "$RUN_DIR" ]] || RUN_DIR="$(new_run_dir)"
echo "run dir: $RUN_DIR"

status=0
run_torchrun --standalone --nproc-per-node="$NPROC_PER_NODE" \
  --max-restarts="$MAX_RESTARTS" train.py hydra.run.dir="$RUN_DIR" "${HYDRA_ARGS[@]}" || status=$?
echo "run dir: $RUN_DIR (logs/, metrics.jsonl, checkpoints/)"
if [[ -f "$RUN_DIR/metrics.jsonl" ]]; then
  echo "last evaluation: $(grep '"kind": "val"' "$RUN_DIR/metrics.jsonl" | tail -n 1)"
fi
exit "$status"
