"""After baking: drop the parts that were not chosen, make scripts executable, optionally git init.

Unchosen options leave no trace: their files go here; their lines in shared files are
chosen by Jinja where the file is rendered.
"""

import pathlib
import shutil
import subprocess

# Filled in by cookiecutter before this hook runs.
CHOICES = {
    "license": "{{ cookiecutter.license }}",
    "tensorboard": "{{ cookiecutter.tensorboard }}",
    "mlflow": "{{ cookiecutter.mlflow }}",
    "wandb": "{{ cookiecutter.wandb }}",
    "slurm": "{{ cookiecutter.slurm }}",
    "container": "{{ cookiecutter.container }}",
    "kubernetes": "{{ cookiecutter.kubernetes }}",
    "sweeps": "{{ cookiecutter.sweeps }}",
    "fsdp": "{{ cookiecutter.fsdp }}",
    "language_model": "{{ cookiecutter.language_model }}",
    "object_storage": "{{ cookiecutter.object_storage }}",
    "diagnostics": "{{ cookiecutter.diagnostics }}",
    "provenance": "{{ cookiecutter.provenance }}",
    "git_init": "{{ cookiecutter.git_init }}",
}
# The experiment trackers share their buffering, tests and doc: gone only when neither is chosen.
CHOICES["trackers"] = "yes" if "yes" in (CHOICES["mlflow"], CHOICES["wandb"]) else "no"
# The command that prepares data (datasets/prepare.py): its kinds are the language model's and the stores' shards.
CHOICES["prepared_data"] = "yes" if "yes" in (CHOICES["language_model"], CHOICES["object_storage"]) else "no"
PACKAGE = "{{ cookiecutter.package_name }}"
# cruft records the template commit it baked; plain cookiecutter leaves `_commit` unset.
BAKED_BY_CRUFT = "{{ cookiecutter._commit | default('') }}" != ""

UNCHOSEN_FILES = {
    ("tensorboard", "no"): [
        f"{PACKAGE}/observe/sinks/tensorboard.py",
        "tests/observe/sinks/test_tensorboard.py",
        "tests/e2e/test_tensorboard.py",
    ],
    ("slurm", "no"): [
        "scripts/slurm.sbatch",
        "tests/e2e/test_slurm.py",
        "tests/e2e/local_slurm.py",
        "docs/slurm.md",
        f"{PACKAGE}/launch/cluster_sweep.py",
        "tests/launch/test_cluster_sweep.py",
        "tests/e2e/test_slurm_sweep.py",
    ],
    ("container", "no"): ["Containerfile", ".dockerignore", "tests/test_container.py"],
    ("sweeps", "no"): [
        f"{PACKAGE}/launch/sweep.py",
        f"{PACKAGE}/launch/sweep_point.py",
        f"{PACKAGE}/launch/optuna_sweep.py",
        f"{PACKAGE}/launch/cluster_sweep.py",
        "tests/launch/test_sweep.py",
        "tests/launch/test_sweep_point.py",
        "tests/launch/test_optuna_sweep.py",
        "tests/launch/test_cluster_sweep.py",
        "tests/e2e/test_sweeps.py",
        "tests/e2e/test_slurm_sweep.py",
        "docs/sweeps.md",
    ],
    ("kubernetes", "no"): [
        "scripts/k8s_job.sh",
        f"{PACKAGE}/launch/modes/kubernetes.py",
        "tests/launch/modes/test_kubernetes.py",
    ],
    ("fsdp", "no"): [
        f"{PACKAGE}/engine/strategies/fsdp.py",
        f"{PACKAGE}/engine/strategies/hsdp.py",
        f"{PACKAGE}/engine/checkpoint/sharded.py",
        f"{PACKAGE}/config/sharding.py",
        "benchmarks/fsdp_memory.py",
        "docs/fsdp.md",
        "tests/engine/strategies/test_fsdp.py",
        "tests/engine/strategies/test_hsdp.py",
        "tests/engine/checkpoint/test_sharded.py",
        "tests/engine/checkpoint/test_sharded_store.py",
        "tests/config/test_sharding.py",
        "tests/e2e/test_fsdp.py",
        "tests/e2e/test_hsdp.py",
    ],
    ("language_model", "no"): [
        f"{PACKAGE}/models/gpt.py",
        f"{PACKAGE}/tasks/language_model.py",
        f"{PACKAGE}/datasets/corpus.py",
        f"{PACKAGE}/datasets/tokenizer.py",
        f"{PACKAGE}/datasets/tokens.py",
        f"{PACKAGE}/datasets/text_shards.py",
        f"{PACKAGE}/generate.py",
        f"{PACKAGE}/config/generate.py",
        f"{PACKAGE}/engine/checkpoint/hf.py",
        "configs/generate.yaml",
        "configs/model/gpt.yaml",
        "configs/task/language_model.yaml",
        "configs/data/text.yaml",
        "configs/data/tokens.yaml",
        "benchmarks/language_model.py",
        "benchmarks/text_memory.py",
        "benchmarks/activation_checkpointing.py",
        "docs/language_model.md",
        "tests/models/test_gpt.py",
        "tests/tasks/test_language_model.py",
        "tests/datasets/test_corpus.py",
        "tests/datasets/test_tokenizer.py",
        "tests/datasets/test_tokens.py",
        "tests/datasets/test_text_shards.py",
        "tests/test_generate.py",
        "tests/config/test_generate.py",
        "tests/engine/checkpoint/test_hf.py",
        "tests/e2e/test_language_model.py",
        "tests/e2e/test_activation_benchmark.py",
    ],
    ("object_storage", "no"): [
        f"{PACKAGE}/common/object_store.py",
        f"{PACKAGE}/config/object_storage.py",
        f"{PACKAGE}/engine/checkpoint/store.py",
        f"{PACKAGE}/datasets/shards.py",
        f"{PACKAGE}/datasets/shard_cache.py",
        f"{PACKAGE}/datasets/text_shards.py",
        "configs/data/shards.yaml",
        "docs/remote_checkpoints.md",
        "docs/data_at_scale.md",
        "tests/object_store.py",
        "tests/common/test_object_store.py",
        "tests/config/test_object_storage.py",
        "tests/engine/checkpoint/test_store.py",
        "tests/datasets/test_shards.py",
        "tests/datasets/test_shard_cache.py",
        "tests/datasets/test_text_shards.py",
        "tests/e2e/test_remote_checkpoints.py",
        "tests/e2e/test_shards.py",
        "tests/engine/checkpoint/test_sharded_store.py",
    ],
    ("diagnostics", "no"): [
        f"{PACKAGE}/observe/hangs.py",
        f"{PACKAGE}/observe/profiling.py",
        f"{PACKAGE}/config/diagnostics.py",
        "tests/observe/test_hangs.py",
        "tests/observe/test_profiling.py",
        "tests/config/test_diagnostics.py",
        "tests/e2e/test_hang.py",
        "tests/e2e/profiled_run.py",
        "scripts/check_comm.sh",
        f"{PACKAGE}/comm_check.py",
        f"{PACKAGE}/launch/modes/check_comm.py",
        "tests/test_comm_check.py",
        "tests/launch/modes/test_check_comm.py",
        "tests/e2e/test_comm_check.py",
        f"{PACKAGE}/engine/nonfinite.py",
        "tests/engine/test_nonfinite.py",
        "tests/e2e/diverged_run.py",
        "benchmarks/nonfinite_check.py",
    ],
    ("prepared_data", "no"): [f"{PACKAGE}/datasets/prepare.py", "tests/datasets/test_prepare.py"],
    ("provenance", "no"): [
        f"{PACKAGE}/observe/provenance.py",
        f"{PACKAGE}/common/launch_command.py",
        "tests/observe/test_provenance.py",
        "tests/common/test_launch_command.py",
    ],
    ("license", "none"): ["LICENSE"],
    ("mlflow", "no"): [
        f"{PACKAGE}/observe/sinks/trackers/mlflow_tracker.py",
        "tests/observe/sinks/trackers/test_mlflow_tracker.py",
        "tests/e2e/test_mlflow.py",
    ],
    ("wandb", "no"): [
        f"{PACKAGE}/observe/sinks/trackers/wandb_tracker.py",
        "tests/observe/sinks/trackers/test_wandb_tracker.py",
        "tests/e2e/test_wandb.py",
        "tests/e2e/wandb_jobs.py",
    ],
    ("trackers", "no"): [
        f"{PACKAGE}/observe/sinks/trackers",
        "tests/observe/sinks/trackers",
        "tests/e2e/tracker_jobs.py",
        "docs/trackers.md",
    ],
}


def main() -> None:
    for (option, value), paths in UNCHOSEN_FILES.items():
        if CHOICES[option] == value:
            for path in map(pathlib.Path, paths):
                if path.is_dir():  # a folder: all its files
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
    for script in pathlib.Path("scripts").glob("*.sh"):
        script.chmod(0o755)
    # Not under cruft: `cruft update` bakes the old and the new template into temp dirs and applies
    # their diff, and a .git made here would be in that diff (the update then fails to apply).
    if CHOICES["git_init"] == "yes" and not BAKED_BY_CRUFT and shutil.which("git"):
        has_identity = subprocess.run(["git", "config", "user.email"], capture_output=True).returncode == 0
        identity = [] if has_identity else ["-c", "user.name={{ cookiecutter.author }}", "-c", "user.email=@"]
        subprocess.run(["git", "init", "-q"], check=True)
        subprocess.run(["git", "add", "-A"], check=True)
        subprocess.run(["git", *identity, "commit", "-q", "-m", "Project from the DDP training template"], check=True)
    next_steps = "pip install -e '.[dev]' && bash scripts/run_single.sh"
    print(f"Project ready. Next: cd {{ cookiecutter.project_slug }} && {next_steps}")


if __name__ == "__main__":
    main()
