"""What a finished sweep leaves: the results table, per-point summaries over seeds, plots, the best config.

    results.csv         one row per trial: its values, epochs run, stopped early, final metrics, samples/s,
                        saved-activation bytes, peak memory (GPU), run directory
    summary.csv         per point of the grid (seeds pooled): n, mean and 95% t-interval of the metric and of
                        samples/s, speedup against the point with model.keep_ratio = 1 where there is one
    sweep.png           the metric against each searched key (mean and interval over seeds) and the
                        speed-vs-accuracy Pareto front (Fig. 5's U-shape and speedup curves for keep_ratio)
    best_config.yaml    the best finished trial's whole config of the swept job; that job's --config loads it

Only trials that ran every epoch enter the summaries, the plots and the best config: an early-stopped trial's
last metric is from fewer epochs and is not comparable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wxray.config import dump_yaml
from wxray.io import atomic_path, write_text
from wxray.tune import calibration
from wxray.tune.space import SEED_KEYS, Axis, trial_config

SPEED = "samples_per_s"
KEEP = "model.keep_ratio"


def collect(grid, axes: list[Axis], metric: str, max_t: int) -> pd.DataFrame:
    """One row per trial of a Tune ResultGrid."""
    rows = []
    for r in grid:
        if r.config is None or "params" not in r.config:
            continue
        m = r.metrics or {}
        epochs = int(m.get("epoch", 0))
        row: dict[str, Any] = {"trial_id": m.get("trial_id", Path(r.path).name)}
        row.update({a.key: _plain(r.config["params"].get(a.key)) for a in axes})
        row.update({"epochs": epochs, "finished": r.error is None and epochs >= max_t,
                    "stopped_early": r.error is None and epochs < max_t, "failed": r.error is not None,
                    metric: m.get(metric, np.nan)})
        for k, v in sorted(m.items()):
            if (k.startswith("val/") or k == "train/epoch_loss" or calibration.is_report_key(k)) and k != metric:
                row[k] = v
        row[SPEED] = m.get("train/epoch_samples_per_s_per_worker", np.nan)
        row["saved_activation_bytes"] = m.get("train/epoch_saved_activation_bytes", np.nan)
        row["peak_memory_bytes"] = m.get("train/epoch_peak_memory_bytes", np.nan)
        row["trial_dir"] = str(Path(r.config["sweep_dir"]) / "trials" / row["trial_id"])
        rows.append(row)
    return pd.DataFrame(rows)


def _plain(v):
    return tuple(v) if isinstance(v, list) else v  # hashable, for grouping (splits are lists)


def _interval(x: np.ndarray) -> tuple[float, float, float]:
    """Mean and 95% t-interval (NaN half-width for one value)."""
    from scipy import stats

    x = x[np.isfinite(x)]
    if len(x) == 0:
        return np.nan, np.nan, np.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, np.nan, np.nan
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return mean, mean - half, mean + half


def summarise(table: pd.DataFrame, axes: list[Axis], metric: str) -> pd.DataFrame:
    """Per grid point (seeds pooled), finished trials only: n, metric and samples/s with 95% intervals."""
    keys = [a.key for a in axes if a.key not in SEED_KEYS]
    done = table[table["finished"]] if len(table) else table
    if not len(done) or not keys:
        return pd.DataFrame()
    rows = []
    for point, group in done.groupby(keys, sort=True, dropna=False):
        point = point if isinstance(point, tuple) else (point,)
        m, m_lo, m_hi = _interval(group[metric].to_numpy(float))
        s, s_lo, s_hi = _interval(group[SPEED].to_numpy(float))
        rows.append({**dict(zip(keys, point, strict=True)), "n": len(group), metric: m, f"{metric} lo": m_lo,
                     f"{metric} hi": m_hi, SPEED: s, f"{SPEED} lo": s_lo, f"{SPEED} hi": s_hi})
    out = pd.DataFrame(rows)
    if KEEP in keys and (out[KEEP] == 1.0).any():
        others = [k for k in keys if k != KEEP]
        dense = out[out[KEEP] == 1.0].set_index(others)[SPEED] if others else out.loc[out[KEEP] == 1.0, SPEED].iloc[0]
        out["speedup_vs_dense"] = (out[SPEED] / (dense.reindex(out.set_index(others).index).to_numpy()
                                                 if others else dense))
    return out


def pareto(table: pd.DataFrame, metric: str, mode: str) -> pd.DataFrame:
    """Finished trials no other finished trial beats in both speed and metric."""
    done = table[table["finished"]].copy() if len(table) else table
    if not len(done):
        return done
    score = done[metric].to_numpy(float) * (1 if mode == "min" else -1)  # lower is better
    speed = done[SPEED].to_numpy(float)
    keep = [not np.any((speed >= speed[i]) & (score <= score[i]) & ((speed > speed[i]) | (score < score[i])))
            for i in range(len(done))]
    return done[keep].sort_values(SPEED)


def best_row(table: pd.DataFrame, metric: str, mode: str) -> pd.Series | None:
    done = table[table["finished"] & np.isfinite(table[metric].astype(float))] if len(table) else table
    if not len(done):
        return None
    return done.loc[done[metric].astype(float).idxmin() if mode == "min" else done[metric].astype(float).idxmax()]


def write_best_config(path: Path, row: pd.Series, axes: list[Axis], base: dict[str, Any], metric: str,
                      cls: type) -> Path:
    """The best trial's whole config of the swept job (`cls`), loadable with that job's --config."""
    params = {a.key: list(row[a.key]) if isinstance(row[a.key], tuple) else plain_value(row[a.key]) for a in axes}
    cfg = trial_config(base, params, cls)
    cfg.out_dir, cfg.run_name = "", ""
    job = "train_sparse" if hasattr(cfg, "train") else "forecast_e2e"
    head = (f"# The best finished trial of a sweep ({row['trial_id']}: {metric} = {float(row[metric]):.6g}).\n"
            f"#   python jobs/{job}.py --config {path.name}\n")
    return write_text(path, head + dump_yaml(cfg))


def plain_value(v):
    return v.item() if isinstance(v, np.generic) else v


def plot(path: Path, table: pd.DataFrame, summary: pd.DataFrame, axes: list[Axis], metric: str,
         mode: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [a.key for a in axes if a.key not in SEED_KEYS and a.kind == "grid"]
    if not len(summary) or not len(table):
        return None
    panels = len(keys) + (1 if KEEP in keys and "speedup_vs_dense" in summary else 0) + 1
    fig, ax = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4), constrained_layout=True, squeeze=False)
    ax = ax[0]
    i = 0
    for key in keys:
        g = summary.groupby(key, sort=True)[[metric, f"{metric} lo", f"{metric} hi"]].mean()
        x = np.arange(len(g))
        ax[i].errorbar(x, g[metric], yerr=[g[metric] - g[f"{metric} lo"], g[f"{metric} hi"] - g[metric]],
                       fmt="o-", capsize=3)
        ax[i].set_xticks(x, [str(v) for v in g.index], rotation=30)
        ax[i].set(xlabel=key, ylabel=metric, title=f"{metric} (mean, 95% CI over seeds)")
        i += 1
    if KEEP in keys and "speedup_vs_dense" in summary:
        g = summary.groupby(KEEP, sort=True)["speedup_vs_dense"].mean()
        ax[i].plot(g.index, g.values, "o-")
        ax[i].axhline(1.0, color="grey", lw=0.8)
        ax[i].set(xlabel=KEEP, ylabel="samples/s / dense", title="measured training speedup")
        i += 1
    done = table[table["finished"]]
    front = pareto(table, metric, mode)
    ax[i].scatter(done[SPEED], done[metric], s=14, alpha=0.6, label="finished trials")
    ax[i].plot(front[SPEED], front[metric], "r.-", label="Pareto front")
    ax[i].set(xlabel="samples/s per worker", ylabel=metric, title="speed vs accuracy")
    ax[i].legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
    return path


def write_csv(path: Path, frame: pd.DataFrame) -> Path:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return path
