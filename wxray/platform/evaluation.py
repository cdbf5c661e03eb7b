"""After training: the final checkpoint rolled out on the test split, written as `forecast.zarr` in the
forecast convention, scored per lead, and a truth / forecast / error map.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from wxray.data.schema import open_store
from wxray.io import atomic_path
from wxray.job import JobContext
from wxray.platform import checkpoints
from wxray.platform.datasets import WindowData
from wxray.platform.rollout import rollout, rollout_anchors, score_per_lead, to_forecast_dataset
from wxray.platform.train_config import TrainSparseConfig
from wxray.platform.trainer_loop import build_forecaster


def save_map_png(path: Path, truth: np.ndarray, forecast: np.ndarray, lat: np.ndarray, lon: np.ndarray,
                 title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    err = forecast - truth
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4), constrained_layout=True)
    vmin, vmax = float(truth.min()), float(truth.max())
    lim = float(np.abs(err).max()) or 1.0
    for ax, field, name, kw in ((axes[0], truth, "truth", {"vmin": vmin, "vmax": vmax}),
                                (axes[1], forecast, "forecast", {"vmin": vmin, "vmax": vmax}),
                                (axes[2], err, "forecast - truth", {"vmin": -lim, "vmax": lim, "cmap": "RdBu_r"})):
        im = ax.pcolormesh(lon, lat, field, shading="auto", **kw)
        ax.set_title(name)
        ax.set_xlabel("longitude")
        fig.colorbar(im, ax=ax, shrink=0.85)
    axes[0].set_ylabel("latitude")
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
    return path


def evaluate_checkpoint(cfg: TrainSparseConfig, data: WindowData, ckpt_dir: Path, out_dir: Path,
                        ctx: JobContext) -> dict[str, Any]:
    """Rollout on the test split (val when there is no test split), forecast zarr, per-lead RMSE, map PNG."""
    state, _ = checkpoints.load(ckpt_dir)
    model = build_forecaster(cfg.model, data.spec)
    checkpoints.load_model_weights(model, state, str(ckpt_dir))
    ds = open_store(cfg.data.store)
    split = "test" if len(data.anchors["test"]) else "val"
    steps = cfg.train.rollout_steps
    autoregressive = [c.name for c in data.spec.targets] == [c.name for c in data.spec.inputs]
    # Inputs are consecutive native steps; with lead_steps > 1 a forecast cannot extend a longer history.
    autoregressive &= data.spec.history == 1 or data.spec.lead_steps == 1
    steps = steps if autoregressive else min(steps, 1)
    anchors = rollout_anchors(ds, np.sort(data.anchors[split]), data.spec, steps) if steps else np.zeros(0, int)
    if len(anchors) == 0:
        return {"rollout_split": split, "rollout_inits": 0}
    fc = rollout(model, data.spec, anchors, steps, seed=cfg.train.seed, batch_size=cfg.data.batch_size)
    forecast = to_forecast_dataset(fc, data.spec, ds, anchors)
    with atomic_path(out_dir / "forecast.zarr") as tmp:
        forecast.to_zarr(tmp, zarr_format=3, consolidated=False)
    scores = score_per_lead(forecast, ds)
    for k in range(steps):
        ctx.tracker.log_metrics({f"rollout/rmse/{ch}": v[k] for ch, v in scores.items()}, step=k + 1)
    ch0 = data.spec.targets[0]
    truth = ds[ch0.variable].isel(time=int(anchors[0]) + data.spec.lead_steps)
    if ch0.level is not None:
        truth = truth.sel(level=ch0.level)
    png = save_map_png(out_dir / "validation_map.png", truth.values, fc[0, 0, 0], data.spec.latitude,
                       data.spec.longitude, f"{ch0.name}, init {str(ds.time.values[anchors[0]])[:16]}, "
                                            f"first lead ({split} split)")
    ctx.tracker.log_artifact(png)
    return {"rollout_split": split, "rollout_inits": int(len(anchors)), "rollout_rmse": scores,
            "forecast": str(out_dir / "forecast.zarr")}
