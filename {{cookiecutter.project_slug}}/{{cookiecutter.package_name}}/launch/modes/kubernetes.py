"""`bash scripts/k8s_job.sh IMAGE=... [KEY=VALUE ...] [overrides ...] > job.yaml`: a Kubeflow PyTorchJob
that runs this project's run_multi.sh in every pod, from the launcher's own keys.

- NNODES=N or MIN:MAX: `elasticPolicy` with minReplicas/maxReplicas, rdzvBackend c10d, and the same
  NNODES for run_multi.sh; pod `<RUN_NAME>-worker-0` is node 0 and hosts the rendezvous (each pod's
  NODE_RANK is its index, the end of its hostname); MAX_RESTARTS is torchrun's and the policy's.
- The run dir is `outputs/<RUN_NAME>` on RUN_VOLUME, a PersistentVolumeClaim every pod mounts (a
  sharded checkpoint needs a volume every node shares), so a restarted pod resumes.
- The pods' terminationGracePeriodSeconds is SHUTDOWN_TIMEOUT_S and a margin: Kubernetes' SIGTERM
  leaves the workers the time run_multi.sh gives them to checkpoint.
- The keys and the training overrides are checked before anything is printed, each mistake one line: the
  overrides as the launcher checks run_single.sh's (composed and through the schema, the backend for the
  pods' processes and GPUs), IMAGE, NAMESPACE and RUN_VOLUME as what Kubernetes accepts (a newline would
  write YAML of its own into the manifest).
- torchrun's PET_* variables in this shell's environment describe the job the shell runs in, not the one
  printed: they are not read, and a warning says so where they would have changed the manifest.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from ..checks import checked_config
from ..keys import Key, LaunchArgs, LaunchError, keys_of, resolve_keys, usage, whole_number
from ..plan import Launch
from ..supervise import Forwarder, say

MODE, SCRIPT = "k8s", "k8s_job.sh"
SHARED_KEYS = ("NPROC_PER_NODE", "MAX_RESTARTS", "NNODES", "MASTER_PORT", "RUN_NAME", "SHUTDOWN_TIMEOUT_S")
KEYS = (
    Key("IMAGE", "", "the container image every pod runs (the project's, pushed where the cluster pulls)",
        modes=(MODE,)),
    Key("RUN_VOLUME", "", "the PersistentVolumeClaim (ReadWriteMany) the run dirs live on (default: RUN_NAME-runs)",
        modes=(MODE,)),
    Key("POD_GPUS", "", "GPUs per pod (default: NPROC_PER_NODE; 0 for CPU pods)", modes=(MODE,)),
    Key("NAMESPACE", "", "the job's namespace (default: the cluster's default)", modes=(MODE,)),
)  # fmt: skip

PROJECT_DIR = "/workspace/project"  # where the project's image holds it (its WORKDIR)
GRACE_MARGIN_S = 30  # after SHUTDOWN_TIMEOUT_S: the launcher's own end, the last checkpoint's commit
SHM_GIB = 8  # /dev/shm for the DataLoader workers (a container's own is 64 MiB)
NODE_RANK_OF_POD = 'NODE_RANK="${HOSTNAME##*-}"'  # <name>-worker-<index>: the index, node 0 the rendezvous host
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")  # a DNS label, short enough for the pods' names
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label (RFC 1123)
CLAIM = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # a DNS subdomain
# An image reference, [registry[:port]/]path[:tag][@digest], as the distribution spec's grammar has it.
HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/"
PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
TAG_AND_DIGEST = r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-f]{32,})?"
IMAGE = re.compile(f"(?:{HOST})?{PATH}(?:/{PATH})*{TAG_AND_DIGEST}")


def node_counts(nnodes: str) -> tuple[int, int]:
    """(MIN, MAX) nodes of NNODES=N or MIN:MAX."""
    if match := re.fullmatch(r"([0-9]+):([0-9]+)", nnodes):
        low, high = int(match.group(1)), int(match.group(2))
        if not 1 <= low <= high:
            raise LaunchError(f"NNODES={nnodes}: give NNODES=MIN:MAX with 1 <= MIN <= MAX")
        return low, high
    count = whole_number({"NNODES": nnodes}, "NNODES", 1)
    return count, count


def literal(value: str) -> str:
    """A key's value as one line says it: quoted where it holds a space or a character not printed."""
    return value if value.isprintable() and " " not in value else repr(value)


def resolve_k8s_keys(given: dict[str, str], environ: dict[str, str]) -> dict[str, str]:
    """The keys, from the command line, else the environment but torchrun's PET_* (this shell's own job's),
    else the default; a warning for each PET_* that would have set another value."""
    values = resolve_keys(given, MODE, {name: environ[name] for name in environ if not name.startswith("PET_")}, {})
    values["NPROC_PER_NODE"] = values["NPROC_PER_NODE"] or "1"
    ignored = [(key.name, name) for key in keys_of(MODE) for name in key.env if name.startswith("PET_")]
    for key, name in ignored:
        if environ.get(name, values[key]) != values[key]:
            say(f"warning: {name}={literal(environ[name])} (torchrun's, of the job this shell runs in) is not read: "
                f"the manifest has {key}={literal(values[key])}; give {key}=... to change it", err=True)  # fmt: skip
    return values


def check_k8s_names(values: dict[str, str], name: str) -> None:
    """IMAGE, RUN_NAME, NAMESPACE and RUN_VOLUME as Kubernetes accepts them; one line each."""
    if not values["IMAGE"]:
        raise LaunchError("IMAGE is required: the project's image in a registry, e.g. IMAGE=registry.example/ddp:1")
    if not IMAGE.fullmatch(values["IMAGE"]):
        raise LaunchError(
            f"IMAGE={literal(values['IMAGE'])} is not an image reference: give [registry/]name[:tag], e.g. "
            "IMAGE=registry.example/ddp:1 (no spaces or newlines)"
        )
    if not NAME.fullmatch(name):
        raise LaunchError(
            f"RUN_NAME={literal(name)} is not a Kubernetes name: lower-case letters, digits and '-', at most 40"
        )
    if values["NAMESPACE"] and not NAMESPACE.fullmatch(values["NAMESPACE"]):
        raise LaunchError(
            f"NAMESPACE={literal(values['NAMESPACE'])} is not a Kubernetes namespace: lower-case letters, digits "
            "and '-', at most 63"
        )
    if values["RUN_VOLUME"] and not CLAIM.fullmatch(values["RUN_VOLUME"]):
        raise LaunchError(
            f"RUN_VOLUME={literal(values['RUN_VOLUME'])} is not a claim name: lower-case letters, digits, '-' "
            "and '.', at most 253"
        )


def pytorch_job(args: LaunchArgs, environ: dict[str, str]) -> dict[str, Any]:
    """The PyTorchJob for these keys and overrides (a plain dict; YAML once dumped), checked first."""
    values = resolve_k8s_keys(args.keys, environ)
    name = values["RUN_NAME"] or "ddp-train"
    check_k8s_names(values, name)
    low, high = node_counts(values["NNODES"])
    nproc = whole_number(values, "NPROC_PER_NODE", 1)
    gpus = whole_number(values, "POD_GPUS", 0) if values["POD_GPUS"] else nproc
    restarts = whole_number(values, "MAX_RESTARTS", 0)
    port = whole_number(values, "MASTER_PORT", 1)
    grace = whole_number(values, "SHUTDOWN_TIMEOUT_S", 0) + GRACE_MARGIN_S
    checked_config(args.overrides, Launch(MODE, values, nproc, gpus))  # as each pod's launcher will check them
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


def main(args: LaunchArgs, environ: dict[str, str], forwarder: Forwarder) -> int:
    """The manifest, or the keys' help, on stdout (nothing started: the forwarder is not used)."""
    print(usage(MODE) if args.help else render(args, environ), end="" if not args.help else "\n")
    return 0
