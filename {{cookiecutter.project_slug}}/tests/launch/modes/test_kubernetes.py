"""launch/modes/kubernetes.py: the PyTorchJob scripts/k8s_job.sh prints, from the launcher's keys, checked against
Kubeflow's own models (kubeflow-training: every field one the operator knows, of its type) and its pod
template against Kubernetes' schema (kubernetes-validate, strict): a manifest either would reject fails here."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from {{cookiecutter.package_name}}.launch.keys import LaunchError, parse_args
from {{cookiecutter.package_name}}.launch.modes.kubernetes import pytorch_job

from ...helpers import PROJECT_DIR, job_env


def job(*argv: str) -> dict[str, Any]:
    return pytorch_job(parse_args(list(argv), "k8s"), {})


def check_against_kubeflow(manifest: dict[str, Any]) -> Any:
    """The manifest as Kubeflow's PyTorchJob model, refusing any field the model does not have (the
    generated client would drop it silently; the operator's schema rejects it)."""
    from kubeflow.training import models
    from kubeflow.training.api_client import ApiClient

    def walk(value: Any, kind: str, where: str) -> None:
        if kind.startswith("list["):
            for index, item in enumerate(value):
                walk(item, kind[5:-1], f"{where}[{index}]")
        elif kind.startswith("dict("):
            for key, item in value.items():
                walk(item, kind[5:-1].split(", ", 1)[1], f"{where}.{key}")
        elif hasattr(models, kind):
            model = getattr(models, kind)
            by_field = {name: model.openapi_types[attr] for attr, name in model.attribute_map.items()}
            assert isinstance(value, dict), f"{where}: {value!r} is not an object ({kind})"
            for key, item in value.items():
                assert key in by_field, f"{where}.{key}: not a field of {kind}"
                walk(item, by_field[key], f"{where}.{key}")
        elif kind in ("int", "str", "bool"):
            assert type(value).__name__ == kind, f"{where}: {value!r} is not a {kind}"

    walk(manifest, "KubeflowOrgV1PyTorchJob", "job")
    response = type("Response", (), {"data": json.dumps(manifest)})()  # as the client reads the API server's
    return ApiClient().deserialize(response, "KubeflowOrgV1PyTorchJob")


def check_pod_template(manifest: dict[str, Any]) -> None:
    import kubernetes_validate

    template = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    resource = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
    kubernetes_validate.validate(resource, kubernetes_validate.latest_version(), strict=True)


def test_an_elastic_job_is_a_pytorchjob_the_operator_and_kubernetes_accept() -> None:
    manifest = job("IMAGE=registry.example/ddp:1", "NNODES=2:4", "NPROC_PER_NODE=8", "RUN_NAME=exp1",
                   "SHUTDOWN_TIMEOUT_S=120", "NAMESPACE=team-a", "task=classification", "model=resnet50",
                   "trainer.epochs=90")  # fmt: skip
    assert manifest["metadata"] == {"name": "exp1", "namespace": "team-a"}
    parsed = check_against_kubeflow(manifest)
    check_pod_template(manifest)
    policy = parsed.spec.elastic_policy
    assert (policy.rdzv_backend, policy.min_replicas, policy.max_replicas, policy.max_restarts) == ("c10d", 2, 4, 3)
    worker = parsed.spec.pytorch_replica_specs["Worker"]
    assert worker.replicas == 4 and parsed.spec.nproc_per_node == "8"
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 150, "SHUTDOWN_TIMEOUT_S and the launcher's margin"
    container = pod["containers"][0]
    assert container["image"] == "registry.example/ddp:1" and container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "runs", "mountPath": "/workspace/project/outputs"} in container["volumeMounts"]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "exp1-runs"}
    command = container["command"][2]
    for part in ("bash scripts/run_multi.sh NNODES=2:4 NPROC_PER_NODE=8 MASTER_ADDR=exp1-worker-0",
                 "RUN_NAME=exp1", "SHUTDOWN_TIMEOUT_S=120", "task=classification model=resnet50 trainer.epochs=90",
                 'NODE_RANK="${HOSTNAME##*-}"'):  # fmt: skip
        assert part in command, command


def test_the_pods_command_is_the_launchers_and_runs_in_bash(tmp_path) -> None:
    """What each pod runs: bash -c's script, with a pod's hostname, gives run_multi.sh these arguments."""
    # task=classification: the overrides are checked, and must hold in a bake whose default task is another
    manifest = job(
        "IMAGE=i", "NNODES=3", "RUN_NAME=exp2", "task=classification", "data=cifar10", "data.root=/data/my images"
    )
    script = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"][2]
    probe = tmp_path / "scripts"
    probe.mkdir()
    (probe / "run_multi.sh").write_text('for a in "$@"; do echo "$a"; done\n')
    pod_env = {"HOSTNAME": "exp2-worker-2", "PATH": "/usr/bin:/bin"}
    said = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=pod_env, capture_output=True, text=True,
                          check=True).stdout.splitlines()  # fmt: skip
    assert said == ["NNODES=3", "NPROC_PER_NODE=1", "MASTER_ADDR=exp2-worker-0", "MASTER_PORT=29500", "RUN_NAME=exp2",
                    "MAX_RESTARTS=3", "SHUTDOWN_TIMEOUT_S=100", "task=classification", "data=cifar10",
                    "data.root=/data/my images",
                    "NODE_RANK=2"]  # fmt: skip
    policy = manifest["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"]) == (3, 3), "static NNODES: MIN = MAX"


def test_a_manifest_with_a_wrong_field_fails_the_checks() -> None:
    manifest = job("IMAGE=i", "NNODES=1:2")
    typo = yaml.safe_load(yaml.safe_dump(manifest))
    typo["spec"]["elasticPolicy"]["minReplica"] = typo["spec"]["elasticPolicy"].pop("minReplicas")
    with pytest.raises(AssertionError, match=r"job.spec.elasticPolicy.minReplica: not a field of"):
        check_against_kubeflow(typo)
    wrong_type = yaml.safe_load(yaml.safe_dump(manifest))
    wrong_type["spec"]["nprocPerNode"] = 8  # the operator's field is a string
    with pytest.raises(AssertionError, match=r"nprocPerNode: 8 is not a str"):
        check_against_kubeflow(wrong_type)
    import kubernetes_validate

    pod = yaml.safe_load(yaml.safe_dump(manifest))
    pod["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["terminationGracePeriod"] = 130
    with pytest.raises(kubernetes_validate.ValidationError, match="terminationGracePeriod"):
        check_pod_template(pod)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["NNODES=2"], "IMAGE is required"),
        (["IMAGE=i", "RUN_NAME=Exp_1"], "RUN_NAME=Exp_1 is not a Kubernetes name"),
        (["IMAGE=i", "NNODES=4:2"], "NNODES=4:2: give NNODES=MIN:MAX with 1 <= MIN <= MAX"),
        (["IMAGE=i", "POD_GPUS=x"], "POD_GPUS=x is not a whole number"),
        (["IMAGE=registry.example/ddp:1\nkind: Pod"], r"IMAGE='registry.example/ddp:1\\nkind: Pod' is not an image"),
        (["IMAGE=reg istry/ddp"], "IMAGE='reg istry/ddp' is not an image reference"),
        (["IMAGE=i", "NAMESPACE=my team"], "NAMESPACE='my team' is not a Kubernetes namespace"),
        (["IMAGE=i", "RUN_VOLUME=runs\n  readOnly: true"], r"RUN_VOLUME='runs\\n  readOnly: true' is not a claim"),
        (["IMAGE=i", "trainer.epocs=3"], r"Could not override 'trainer.epocs'.*\(fix that override and launch again\)"),
        (["IMAGE=i", "model=resnet5"], r"Could not find 'model/resnet5'; choose one of: .*resnet50"),
        (["IMAGE=i", "POD_GPUS=0", "dist.backend=nccl"], "dist.backend=nccl"),
    ],
)
def test_keys_that_cannot_make_a_job_are_one_line(argv: list[str], said: str) -> None:
    with pytest.raises(LaunchError, match=said) as refused:
        job(*argv)
    assert "\n" not in str(refused.value)


def test_torchruns_variables_in_this_shell_do_not_size_the_job_and_are_said_to_be_ignored(capsys) -> None:
    """PET_* describe the job this shell runs in (a pod of another job, say), not the one printed."""
    manifest = pytorch_job(parse_args(["IMAGE=i", "NNODES=3"], "k8s"), {"PET_NNODES": "8", "PET_NPROC_PER_NODE": "4"})
    assert manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert manifest["spec"]["nprocPerNode"] == "1"
    assert capsys.readouterr().err.splitlines() == [
        "warning: PET_NPROC_PER_NODE=4 (torchrun's, of the job this shell runs in) is not read: the manifest has "
        "NPROC_PER_NODE=1; give NPROC_PER_NODE=... to change it",
        "warning: PET_NNODES=8 (torchrun's, of the job this shell runs in) is not read: the manifest has NNODES=3; "
        "give NNODES=... to change it",
    ]
    pytorch_job(parse_args(["IMAGE=i", "NNODES=8"], "k8s"), {"PET_NNODES": "8", "NNODES": "5"})
    assert capsys.readouterr().err == "", "the same value: nothing to say"
    plain = pytorch_job(parse_args(["IMAGE=i"], "k8s"), {"NNODES": "5"})
    assert plain["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 5, "NNODES exported on purpose is read"


def test_the_script_prints_the_manifest_and_cpu_pods_ask_for_no_gpu() -> None:
    proc = subprocess.run(["bash", "scripts/k8s_job.sh", "IMAGE=i", "POD_GPUS=0", "NNODES=1:2", "trainer.epochs=2"],
                          cwd=PROJECT_DIR, env=job_env(), capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# kubectl apply -f job.yaml")
    manifest = yaml.safe_load(proc.stdout)
    check_against_kubeflow(manifest)
    assert "resources" not in manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    bad = subprocess.run(["bash", "scripts/k8s_job.sh"], cwd=PROJECT_DIR, env=job_env(), capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: IMAGE is required"), bad.stderr
    typo = subprocess.run(["bash", "scripts/k8s_job.sh", "IMAGE=i", "trainer.epocs=2"], cwd=PROJECT_DIR, env=job_env(),
                          capture_output=True, text=True)  # fmt: skip
    assert typo.returncode == 2 and typo.stdout == "", "nothing of a manifest printed"
    assert typo.stderr.startswith("error: Could not override 'trainer.epocs'") and typo.stderr.count("\n") == 1
