"""`bash scripts/k8s_job.sh IMAGE=... [KEY=VALUE ...] [overrides ...] > job.yaml`: a Kubeflow PyTorchJob
that runs this project's run_multi.sh in every pod, from the launcher's own keys.

- NNODES=N or MIN:MAX: `elasticPolicy` with minReplicas/maxReplicas, rdzvBackend c10d, and the same
  NNODES for run_multi.sh; pod `<RUN_NAME>-worker-0` is node 0 and hosts the rendezvous (each pod's
  NODE_RANK is its index, the end of its hostname); MAX_RESTARTS is torchrun's and the policy's.
- The run dir is `outputs/<RUN_NAME>` on RUN_VOLUME, a PersistentVolumeClaim every pod mounts (a
  sharded checkpoint needs a volume every node shares), so a restarted pod resumes.
- The pods' terminationGracePeriodSeconds is SHUTDOWN_TIMEOUT_S and a margin: Kubernetes' SIGTERM
  leaves the workers the time run_multi.sh gives them to checkpoint.
- The training overrides go into each pod's command as given; the launcher in each pod checks them.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from .keys import LaunchArgs, LaunchError, resolve_keys, whole_number

PROJECT_DIR = "/workspace/project"  # the Containerfile's WORKDIR
GRACE_MARGIN_S = 30  # after SHUTDOWN_TIMEOUT_S: the launcher's own end, the last checkpoint's commit
SHM_GIB = 8  # /dev/shm for the DataLoader workers (a container's own is 64 MiB)
NODE_RANK_OF_POD = 'NODE_RANK="${HOSTNAME##*-}"'  # <name>-worker-<index>: the index, node 0 the rendezvous host
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")  # a DNS label, short enough for the pods' names


def node_counts(nnodes: str) -> tuple[int, int]:
    """(MIN, MAX) nodes of NNODES=N or MIN:MAX."""
    if match := re.fullmatch(r"([0-9]+):([0-9]+)", nnodes):
        low, high = int(match.group(1)), int(match.group(2))
        if not 1 <= low <= high:
            raise LaunchError(f"NNODES={nnodes}: give NNODES=MIN:MAX with 1 <= MIN <= MAX")
        return low, high
    count = whole_number({"NNODES": nnodes}, "NNODES", 1)
    return count, count


def pytorch_job(args: LaunchArgs, environ: dict[str, str]) -> dict[str, Any]:
    """The PyTorchJob for these keys and overrides (a plain dict; YAML once dumped)."""
    values = resolve_keys(args.keys, "k8s", environ, {})
    if not values["IMAGE"]:
        raise LaunchError("IMAGE is required: the image the Containerfile builds, e.g. IMAGE=registry.example/ddp:1")
    name = values["RUN_NAME"] or "ddp-train"
    if not NAME.fullmatch(name):
        raise LaunchError(f"RUN_NAME={name} is not a Kubernetes name: lower-case letters, digits and '-', at most 40")
    low, high = node_counts(values["NNODES"])
    nproc = whole_number({**values, "NPROC_PER_NODE": values["NPROC_PER_NODE"] or "1"}, "NPROC_PER_NODE", 1)
    gpus = whole_number(values, "POD_GPUS", 0) if values["POD_GPUS"] else nproc
    restarts = whole_number(values, "MAX_RESTARTS", 0)
    port = whole_number(values, "MASTER_PORT", 1)
    grace = whole_number(values, "SHUTDOWN_TIMEOUT_S", 0) + GRACE_MARGIN_S
    launch = ["bash", "scripts/run_multi.sh", f"NNODES={values['NNODES']}", f"NPROC_PER_NODE={nproc}",
              f"MASTER_ADDR={name}-worker-0", f"MASTER_PORT={port}", f"RUN_NAME={name}", f"MAX_RESTARTS={restarts}",
              f"SHUTDOWN_TIMEOUT_S={grace - GRACE_MARGIN_S}", *args.overrides]  # fmt: skip
    command = f"exec {shlex.join(launch)} {NODE_RANK_OF_POD}"
    container: dict[str, Any] = {
        "name": "pytorch",  # the name the operator looks for
        "image": values["IMAGE"],
        "workingDir": PROJECT_DIR,
        "command": ["bash", "-c", command],
        "ports": [{"name": "rendezvous", "containerPort": port}],
        "volumeMounts": [
            {"name": "runs", "mountPath": f"{PROJECT_DIR}/outputs"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}  # a quantity: a string
    pod = {
        "terminationGracePeriodSeconds": grace,
        "containers": [container],
        "volumes": [
            {"name": "runs", "persistentVolumeClaim": {"claimName": values["RUN_VOLUME"] or f"{name}-runs"}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}},
        ],
    }
    metadata = {"name": name, **({"namespace": values["NAMESPACE"]} if values["NAMESPACE"] else {})}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata,
        "spec": {
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": low, "maxReplicas": high, "maxRestarts": restarts},
            "nprocPerNode": str(nproc),
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": high, "restartPolicy": "OnFailure", "template": {"spec": pod}},
            },
        },
    }


def render(args: LaunchArgs, environ: dict[str, str]) -> str:
    """The PyTorchJob as YAML, with a comment saying how to submit it."""
    import yaml

    job = pytorch_job(args, environ)
    first = f"{job['metadata']['name']}-worker-0"
    head = f"# kubectl apply -f job.yaml (needs Kubeflow's training operator); logs: kubectl logs {first}\n"
    return head + yaml.safe_dump(job, sort_keys=False)
