"""After training: the final checkpoint rolled out on the test split, written as `forecast.zarr` in the
forecast convention, scored per lead beside persistence (`verify.lead_scores`), and a truth / forecast /
error map of the first target at the first lead (`forecast_map_<split>.png`). Loading, rollout, forecast
store and scores are the forecast job's (`forecast/forecaster.py`); a rollout stops at one step where a
forecast cannot be the next input (`rollout.possible_steps`, the rule of `check_rollout`).

With `train.routing_members` = M > 1 every init is forecast M times, one routing draw each (rollout.py;
for model.name=edm one sample each, drawn with `sampler`), and `forecast.zarr` has a `member` dim; the
per-lead scores are those of the ensemble mean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from wxray.console import say
from wxray.data.anchors import rollout_anchors
from wxray.data.schema import INIT, LAT, LEAD, LON, TIME, open_store
from wxray.data.window_data import WindowData
from wxray.forecast.forecaster import forecast_and_score, in_process, load_forecaster
from wxray.forecast.rollout import possible_steps, routing_varies
from wxray.io import atomic_path
from wxray.job import JobContext
from wxray.platform.cluster.replicas import ReplicaRunner
from wxray.platform.train.config import TrainSparseConfig


def save_map_png(path: Path, truth: np.ndarray, forecast: np.ndarray, lat: np.ndarray, lon: np.ndarray,
                 title: str, units: str = "") -> Path:
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
        fig.colorbar(im, ax=ax, shrink=0.85, label=units)
    axes[0].set_ylabel("latitude")
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
    return path


def forecast_map(out_dir: Path, forecast, ds, spec, split: str) -> Path:
    """Truth / forecast (ensemble mean) / error of the first target channel, first init, first lead."""
    ch = spec.targets[0]
    fc = forecast[ch.variable].isel(init_time=0, lead_time=0)
    if "member" in fc.dims:
        fc = fc.mean("member")
    init, lead = fc[INIT].values, fc[LEAD].values
    truth = ds[ch.variable].sel({TIME: init + lead})
    if ch.level is not None:
        fc, truth = fc.sel(level=ch.level), truth.sel(level=ch.level)
    truth = truth.isel({LAT: slice(*spec.fit.rows), LON: slice(*spec.fit.cols)})  # the kept grid
    hours = lead / np.timedelta64(1, "h")
    members = forecast.sizes.get("member", 1)
    what = f"mean of {members} members, " if members > 1 else ""
    title = f"{ch.name}, init {str(init)[:16]}, lead +{hours:g} h ({what}{split} split)"
    return save_map_png(out_dir / f"forecast_map_{split}.png", truth.values, fc.values, spec.latitude,
                        spec.longitude, title, units=str(ds[ch.variable].attrs.get("units", "")))


def evaluate_checkpoint(cfg: TrainSparseConfig, data: WindowData, ckpt_dir: Path, out_dir: Path,
                        ctx: JobContext) -> dict[str, Any]:
    """Rollout on the test split (val when there is no test split), forecast zarr, per-lead scores, map PNG."""
    spec = data.spec
    model = load_forecaster(ckpt_dir, cfg.model, spec, cfg.sampler)
    ds = open_store(spec.store)
    split = "test" if len(data.anchors["test"]) else "val"
    steps = possible_steps(spec, cfg.train.rollout_steps)  # one step where a forecast is no next input
    anchors = rollout_anchors(ds, np.sort(data.anchors[split]), spec, steps) if steps else np.zeros(0, int)
    if len(anchors) == 0:
        return {"rollout": {"split": split, "inits": 0}}
    n_members, note = cfg.train.routing_members, {}
    if n_members > 1 and not (cfg.model.generative or routing_varies(model)):
        # Only found out after training: a warning and the deterministic forecast, not a lost run.
        note = {"note": f"train.routing_members={n_members} ignored: model.selection={cfg.model.selection} "
                        f"(deterministic_eval={cfg.model.deterministic_eval}) draws no random routing"}
        say(note["note"])
        n_members = 1
    members = list(range(n_members)) if n_members > 1 else None
    runner = ReplicaRunner(cfg.forecast_workers) if cfg.forecast_workers.actors else in_process
    run = forecast_and_score(model, spec, ds, anchors, steps, out_dir, ctx.tracker, seed=cfg.train.seed,
                             batch_size=cfg.data.batch_size, members=members, runner=runner)
    ctx.tracker.log_artifact(forecast_map(out_dir, run.forecast, ds, spec, split))
    return {"rollout": {"split": split, **run.report, **note}, "forecast": str(run.path)}
