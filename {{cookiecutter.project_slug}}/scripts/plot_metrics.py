"""Plot a run's metrics.jsonl to <run dir>/metrics.png: `python scripts/plot_metrics.py RUN_DIR`.

Loss (training and validation), the task's other validation metrics (accuracy, bits per
byte, ...) and the learning rate against the global step, for a person without TensorBoard.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402


def read_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist; give the run dir of a training run (outputs/<run>)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(records: list[dict], kind: str, key: str) -> tuple[list[int], list[float]]:
    chosen = [r for r in records if r.get("kind") == kind and key in r]
    return [r["step"] for r in chosen], [float(r[key]) for r in chosen]  # float("NaN"): a figure not finite


def validation_metrics(records: list[dict]) -> list[str]:
    """The task's validation metrics besides the loss (val_acc, val_macro_f1, ...), in record order."""
    names: list[str] = []
    for record in records:
        if record.get("kind") == "val":
            names += [k for k in record if k.startswith("val_") and k not in ("val_loss", "val_samples", *names)]
    return names


def plot(run_dir: Path) -> Path:
    records = read_records(run_dir)
    metrics = validation_metrics(records)
    figure, axes_row = plt.subplots(1, 2 + len(metrics), figsize=(5 * (2 + len(metrics)), 4.2), layout="constrained")
    loss_ax, lr_ax, metric_axes = axes_row[0], axes_row[-1], axes_row[1:-1]
    loss_ax.plot(*series(records, "train", "train_loss"), label="training loss", color="tab:blue")
    steps, losses = series(records, "val", "val_loss")
    loss_ax.plot(steps, losses, "o-", label="validation loss", color="tab:orange")
    loss_ax.set(title="Loss", xlabel="optimizer step", ylabel="loss")
    for axes, name in zip(metric_axes, metrics, strict=True):
        axes.plot(*series(records, "val", name), "o-", label=f"validation {name[4:]}", color="tab:green")
        axes.set(title=f"Validation {name[4:]}", xlabel="optimizer step", ylabel=name[4:])
    lr_ax.plot(*series(records, "train", "lr"), label="learning rate", color="tab:purple")
    lr_ax.set(title="Learning rate", xlabel="optimizer step", ylabel="learning rate")
    for axes in axes_row:
        axes.grid(alpha=0.3)
        axes.legend()
    last_step = max([r["step"] for r in records] or [0])
    figure.suptitle(f"{run_dir.name}: up to step {last_step}, evaluations: {len(steps)}")
    out = run_dir / "metrics.png"
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run dir holding metrics.jsonl")
    print(plot(parser.parse_args(argv).run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
