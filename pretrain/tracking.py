"""Pretraining's run tracking: a progress bar, wandb (offline unless WANDB_MODE says otherwise) or TensorBoard, and
the loss curve drawn at the end (`<output_dir>/loss_curve.png`). pretrain/train.py's loop calls them on rank 0.
"""

from __future__ import annotations

import math
import os

from tqdm.auto import tqdm


class Logger:
    """tqdm on rank 0 plus wandb (offline unless WANDB_MODE says otherwise) or tensorboard; no-op elsewhere."""

    def __init__(
        self,
        report_to: str,
        output_dir: str,
        run_name: str | None,
        enabled: bool,
        total: int,
        initial: int,
        config: dict,
    ):
        self.enabled, self.backend, self.run = enabled, report_to if enabled else "none", None
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, desc="pretrain", dynamic_ncols=True)
        if self.backend == "wandb":
            os.environ.setdefault("WANDB_MODE", "offline")
            import wandb  # lazy: only when tracking with it (~1.5 s import)

            self.run = wandb.init(project="smolalign", name=run_name, dir=output_dir, config=config)
        elif self.backend == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # lazy: an optional package

            self.run = SummaryWriter(os.path.join(output_dir, "runs"))
        elif self.backend != "none":
            raise ValueError(f"report_to={report_to!r}: choose 'wandb', 'tensorboard' or 'none'")

    def log(self, metrics: dict, step: int) -> None:
        if self.backend == "wandb":
            self.run.log(metrics, step=step)
        elif self.backend == "tensorboard":
            for k, v in metrics.items():
                self.run.add_scalar(k, v, step)

    def close(self) -> None:
        self.bar.close()
        if self.run is not None:
            self.run.finish() if self.backend == "wandb" else self.run.close()


def plot_losses(history: list[dict], evals: list[dict], path: str) -> None:
    """Train loss (and its running mean) and held-out loss per source against tokens seen -> PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ok = [h for h in history if math.isfinite(h["loss"])]
    ax.plot([h["tokens"] for h in ok], [h["loss"] for h in ok], lw=0.5, alpha=0.4, label="train")
    for key in sorted({k for e in evals for k in e if k.startswith("eval_loss")}):
        pts = [(e["tokens"], e[key]) for e in evals if key in e]
        ax.plot(*zip(*pts), marker="o", ms=3, label=key.replace("eval_loss/", "held-out ").replace("_", " "))
    ax.set(xlabel="tokens", ylabel="loss (nats/token)", title=os.path.basename(os.path.dirname(path) or "."))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
