"""Scores of a trained end-to-end stage on the held-out windows (the test split, else validation), on the driver.

    encoder    analysis RMSE per channel against the true state, beside the climatology's RMSE (ratio < 1:
               the observations carry information); the analysis again with each stream denied (its embedding
               zeroed), so the streams' contributions show; a map of analysis vs truth
    chain      lead-1 forecast RMSE beside the persistence of its own analysis (and the analysis RMSE)
    decoder    station RMSE of the decoder on the true state beside bilinear interpolation of that state

RMSE: latitude-weighted over the kept grid, sqrt of the mean over windows of the spatial MSE (physical units);
stations: sqrt of the mean squared error over every good report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from wxray.data.e2e_windows import E2EData, E2EReader
from wxray.data.schema import TIME, time_step
from wxray.data.windows import WindowSpec, open_lazy
from wxray.forecast import checkpoints
from wxray.forecast.stages import build_stage_model, decode_stations, stage_identity
from wxray.forecast.state import next_state, obs_of, physical
from wxray.models import latitude_weights
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.platform.train.tasks import VALIDATION_RMSE
from wxray.verify.field_plots import plot_field_rows
from wxray.verify.stations import bilinear_at_points

EVAL_BATCH = 16


def held_out(data: E2EData) -> tuple[str, np.ndarray]:
    for split in ("test", "val"):
        if len(data.windows.anchors.get(split, [])):
            return split, np.sort(data.windows.anchors[split])
    return "train", np.sort(data.windows.anchors["train"])


def load_stage(cfg: TrainE2EConfig, data: E2EData, ckpt: Path) -> torch.nn.Module:
    state, _ = checkpoints.load(ckpt, expect_model=stage_identity(cfg, data))
    model = build_stage_model(cfg, data)
    checkpoints.load_model_weights(model, state, str(ckpt))
    return model.eval()


def batches(data: E2EData, anchors: np.ndarray):
    reader = E2EReader(data.spec, data.obs)
    for i in range(0, len(anchors), EVAL_BATCH):
        yield {k: torch.from_numpy(np.asarray(v)) for k, v in reader({"anchor": anchors[i: i + EVAL_BATCH]}).items()}


class FieldRMSE:
    """Latitude-weighted RMSE per channel, accumulated over batches of windows: the scorecard's RMSE
    (`verify.metrics.RMSE.from_means` of the mean per-window MSE)."""

    def __init__(self, spec: WindowSpec):
        self.w = latitude_weights(torch.as_tensor(spec.latitude, dtype=torch.float32))[None, None, :, None]
        self.names = [c.name for c in spec.inputs]
        self.se, self.n = torch.zeros(len(self.names), dtype=torch.float64), 0

    def add(self, pred: torch.Tensor, truth: torch.Tensor) -> None:
        self.se += ((pred - truth) ** 2 * self.w).mean(dim=(-2, -1)).sum(0).double()
        self.n += pred.shape[0]

    def result(self) -> dict[str, float]:
        return {n: float(f"{float(VALIDATION_RMSE.from_means(v / max(1, self.n))):.6g}")
                for n, v in zip(self.names, self.se.tolist())}


def _ratio(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: float(f"{a[k] / b[k]:.4g}") for k in a if b.get(k)}


def _mean_change(new: dict[str, float], base: dict[str, float]) -> float:
    return float(f"{np.mean([new[k] / base[k] - 1 for k in base if base[k]]):.4g}")


@torch.no_grad()
def evaluate_encoder(model, data: E2EData, anchors: np.ndarray, out_dir: Path) -> dict[str, Any]:
    spec, n, k = data.spec, len(data.spec.inputs), len(data.spec.constants)
    names = [s.name for s in data.obs.streams]
    analysis, clim = FieldRMSE(spec), FieldRMSE(spec)
    denied = {s: FieldRMSE(spec) for s in names}
    counts = dict.fromkeys(names, 0.0)
    first = None
    for b in batches(data, anchors):
        truth = physical(spec, b["x"][:, :n])
        z0 = physical(spec, model(obs_of(b), b["static"]))
        analysis.add(z0, truth)
        clim.add(physical(spec, b["static"][:, k: k + n]), truth)
        for s in names:
            denied[s].add(physical(spec, model(obs_of(b), b["static"], deny=(s,))), truth)
            counts[s] += float(b[f"obs.{s}.mask"].sum())
        if first is None:
            first = (truth[0].numpy(), z0[0].numpy(), int(anchors[0]))  # batches go in anchor order
    a, c = analysis.result(), clim.result()
    densest = max(counts, key=counts.get)
    report = {"analysis_rmse": a, "climatology_rmse": c, "analysis_to_climatology": _ratio(a, c),
              "observations": {s: int(v) for s, v in counts.items()}, "densest_stream": densest,
              "denied_rmse": {s: d.result() for s, d in denied.items()},
              "denial_rmse_change": {s: _mean_change(d.result(), a) for s, d in denied.items()},
              "windows": len(anchors)}
    if first is not None:
        report["plot"] = str(plot_analysis(spec, *first, out_dir / "plots" / "analysis_vs_truth.png"))
    return report


def plot_analysis(spec: WindowSpec, truth: np.ndarray, analysis: np.ndarray, anchor: int, path: Path) -> Path:
    """The encoder's analysis of one held-out window beside the truth and their difference, in physical units."""
    store = open_lazy(spec.store)
    when = np.datetime_as_string(store[TIME].values[anchor], unit="m").replace("T", " ")
    fig = plot_field_rows([("truth", truth), ("analysis", analysis), ("analysis - truth", analysis - truth)],
                          [c.name for c in spec.inputs],
                          [str(store[c.variable].attrs.get("units", "")) for c in spec.inputs],
                          spec.latitude, spec.longitude, f"encoder analysis vs truth, valid {when} UTC "
                          f"(first held-out window)", difference_rows=(2,))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


@torch.no_grad()
def evaluate_chain(model, data: E2EData, anchors: np.ndarray) -> dict[str, Any]:
    spec, n = data.spec, len(data.spec.inputs)
    fc, pers, ana = FieldRMSE(spec), FieldRMSE(spec), FieldRMSE(spec)
    for b in batches(data, anchors):
        z0, pred = model(b)
        truth1 = physical(spec, next_state(spec, b["x"][:, :n], b["y"]))
        fc.add(physical(spec, next_state(spec, z0, pred)), truth1)
        pers.add(physical(spec, z0), truth1)
        ana.add(physical(spec, z0), physical(spec, b["x"][:, :n]))
    f, p = fc.result(), pers.result()
    return {"lead_hours": int(spec.lead_steps * _step_hours(spec)), "forecast_rmse": f,
            "persistence_of_analysis_rmse": p, "forecast_to_persistence": _ratio(f, p),
            "analysis_rmse": ana.result(), "windows": len(anchors)}


def _step_hours(spec: WindowSpec) -> float:
    return float(time_step(open_lazy(spec.store)) / np.timedelta64(1, "h"))


@torch.no_grad()
def evaluate_decoder(model, data: E2EData, anchors: np.ndarray) -> dict[str, Any]:
    """Decoder vs bilinear interpolation of the same (true) state, at every good station report."""
    spec, n = data.spec, len(data.spec.inputs)
    stream = next(s for s in data.obs.streams if s.name == data.station_stream)
    names = data.station_variables
    state_idx = {v: [c.name for c in spec.inputs].index(v) for v in names if v in [c.name for c in spec.inputs]}
    mean = np.array([stream.mean[v] for v in names])
    std = np.array([stream.std[v] for v in names])
    se = {"decoder": np.zeros(len(names)), "bilinear": np.zeros(len(names))}
    count = np.zeros(len(names))
    for b in batches(data, anchors):
        pred, values, mask = (t.numpy() for t in decode_stations(model, b, data))
        truth = values * std + mean
        se["decoder"] += (((pred * std + mean) - truth) ** 2 * mask).sum(axis=(0, 1))
        count += mask.sum(axis=(0, 1))
        state = physical(spec, b["x"][:, :n]).numpy()
        coords = b[f"obs.{data.station_stream}.coords"].numpy()
        for j, v in enumerate(names):
            if v not in state_idx:
                continue
            for i in range(len(state)):
                interp = bilinear_at_points(_field(spec, state[i, state_idx[v]]), coords[i, :, 0], coords[i, :, 1])
                se["bilinear"][j] += (((np.asarray(interp) - truth[i, :, j]) ** 2) * mask[i, :, j]).sum()
    out: dict[str, Any] = {"station_stream": stream.name, "reports": {v: int(c) for v, c in zip(names, count)}}
    for key, s in se.items():
        out[f"{key}_rmse"] = {v: float(f"{np.sqrt(s[j] / max(1, count[j])):.6g}") for j, v in enumerate(names)
                              if key == "decoder" or v in state_idx}
    out["decoder_to_bilinear"] = _ratio(out["decoder_rmse"], out["bilinear_rmse"])
    return out


def _field(spec: WindowSpec, values: np.ndarray):
    import xarray as xr

    return xr.DataArray(values, dims=("latitude", "longitude"),
                        coords={"latitude": spec.latitude, "longitude": spec.longitude})


def evaluate_stage(cfg: TrainE2EConfig, data: E2EData, ckpt: Path, out_dir: Path, tracker) -> dict[str, Any]:
    split, anchors = held_out(data)
    model = load_stage(cfg, data, ckpt)
    if cfg.stage == "encoder":
        report = evaluate_encoder(model, data, anchors, out_dir)
    elif cfg.stage == "chain":
        report = evaluate_chain(model, data, anchors)
    else:
        report = evaluate_decoder(model, data, anchors)
    report["split"] = split
    flat = {f"{split}/{k}/{name}": v for k, d in report.items() if isinstance(d, dict)
            for name, v in d.items() if isinstance(v, (int, float))}
    tracker.log_metrics(flat)
    if "plot" in report:
        tracker.log_artifact(Path(report["plot"]), "plots")
    return {cfg.stage: report}
