#!/usr/bin/env bash
# A Kubeflow PyTorchJob for this project, printed: the launcher's keys (NNODES=N or MIN:MAX, NPROC_PER_NODE,
# RUN_NAME, MAX_RESTARTS, SHUTDOWN_TIMEOUT_S, MASTER_PORT) plus IMAGE, RUN_VOLUME, POD_GPUS, NAMESPACE, and
# the training overrides (docs/launching.md, "Kubernetes"):
#   bash scripts/k8s_job.sh IMAGE=registry.example/ddp:1 NNODES=2:4 NPROC_PER_NODE=8 RUN_NAME=exp1 model=resnet50 > job.yaml
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m {{ cookiecutter.package_name }}.launch k8s "$@"
