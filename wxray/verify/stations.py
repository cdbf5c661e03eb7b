"""Station verification: point forecasts scored against a point observation stream, and the bilinear baseline.

A *station forecast* (Parquet, written by forecast_e2e) has one row per (init_time, lead_time, station,
variable): columns `init_time` timestamp, `lead_time` int hours, `station` string, `latitude`, `longitude`
(degrees), `variable` (a channel name: `2m_temperature`, `geopotential_500`), `value` (physical units).
The truth is a point stream of an obs dir (`wxray.verify.station_truth`): a forecast row is paired with the
observation of the same station, variable and valid time init_time + lead_time exactly (quality 0, reported).
Unpaired forecast rows (missing reports) are not scored; a forecast without any pair is an error, as is a
forecast NaN (a model always gives a value).

Scores per (variable, lead_time) over the paired rows, e = forecast - truth:
RMSE = sqrt(mean e^2), bias = mean e (positive: forecast too high), MAE = mean |e|, count = number of pairs;
per station RMSE over all its inits and leads. A baseline (a second station forecast, or `bilinear`: the
gridded forecast interpolated to the stations, `station_forecasts_from_grid`) is scored on exactly the same
pairs, so rel_diff = RMSE / baseline RMSE - 1 compares like with like (negative: the forecast is better).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from wxray.data import location
from wxray.data.schema import GLOBAL, INIT, LAT, LEAD, LEVEL, LON, LON_360, grid_kind, wrap_longitudes
from wxray.data.sources import first_line
from wxray.errors import DataError
from wxray.verify.ensemble import MEMBER_DIMS
from wxray.verify.forecasts import longitude_arc
from wxray.verify.station_truth import pair_with_truth

COLUMNS = (INIT, LEAD, "station", LAT, LON, "variable", "value")
KEYS = [INIT, LEAD, "station", "variable"]  # one forecast per key
HOUR = np.timedelta64(1, "h")
REL_DIFF_CONVENTION = "forecast / baseline - 1 of the station RMSE; negative is better"


# ---------------------------------------------------------------- interpolation

def _axis_weights(axis: np.ndarray, x: np.ndarray, periodic: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i0, i1, w): x lies between axis[i0] and axis[i1] (ascending), value = (1 - w) f[i0] + w f[i1].
    Periodic: the axis covers [axis[0], axis[0] + 360) and wraps; otherwise x is clamped to the ends."""
    n = axis.size
    if periodic:
        ext = np.append(axis, axis[0] + 360.0)
        x = axis[0] + np.mod(x - axis[0], 360.0)
        i0 = np.clip(np.searchsorted(ext, x, side="right") - 1, 0, n - 1)
        return i0, (i0 + 1) % n, (x - ext[i0]) / (ext[i0 + 1] - ext[i0])
    x = np.clip(x, axis[0], axis[-1])
    i0 = np.clip(np.searchsorted(axis, x, side="right") - 1, 0, n - 2)
    return i0, i0 + 1, (x - axis[i0]) / (axis[i0 + 1] - axis[i0])


def bilinear_at_points(field: xr.DataArray, latitude, longitude, dim: str = "point") -> xr.DataArray:
    """`field` (dims ..., latitude, longitude) bilinearly interpolated to the points (latitude[k], longitude[k]):
    dims (..., `dim`), leading dims kept. Exact for fields bilinear in (latitude, longitude) within a cell.

    Latitude may run either way. A global grid (`grid_kind`) is periodic in longitude: a point between the
    last meridian and 360 E is interpolated with the first (no gap at the seam), in either longitude
    convention of grid or points; points poleward of the outermost rows take those rows' values. On a
    regional grid every point must lie inside its box (`longitude_arc`), else DataError."""
    lat_pts = np.asarray(latitude, dtype=np.float64).ravel()
    lon_pts = np.asarray(longitude, dtype=np.float64).ravel()
    if lat_pts.shape != lon_pts.shape:
        raise DataError(f"bilinear: {lat_pts.size} latitudes but {lon_pts.size} longitudes")
    if field.sizes[LAT] < 2 or field.sizes[LON] < 2:
        raise DataError(f"bilinear: field '{field.name}' needs at least 2 latitudes and 2 longitudes "
                        f"(has {field.sizes[LAT]}x{field.sizes[LON]})")
    lat = np.asarray(field[LAT].values, dtype=np.float64)
    lat_order = np.argsort(lat, kind="stable")
    lon = np.asarray(field[LON].values, dtype=np.float64)
    periodic = grid_kind(lon) == GLOBAL
    if periodic:
        offset = wrap_longitudes(lon, LON_360)
        points = wrap_longitudes(lon_pts, LON_360)
    else:  # degrees east of the box's west edge: a box across 0 E is one interval in either convention
        west, east = longitude_arc(lon, f"field '{field.name}'")
        tol = 1e-6
        offset = np.mod(lon - west + tol, 360.0) - tol
        points = np.mod(lon_pts - west + tol, 360.0) - tol
        width = float(np.mod(east - west, 360.0))
        lat_out = (lat_pts < lat.min() - tol) | (lat_pts > lat.max() + tol)
        outside = np.flatnonzero(lat_out | (points > width + tol))
        if outside.size:
            k = outside[0]
            raise DataError(f"bilinear: {outside.size} point(s) lie outside the regional grid of '{field.name}' "
                            f"(latitude {lat.min():g}..{lat.max():g}, longitude {west:g}..{east:g}; first: "
                            f"latitude {lat_pts[k]:g}, longitude {lon_pts[k]:g})")
    lon_order = np.argsort(offset, kind="stable")
    i0, i1, wy = _axis_weights(lat[lat_order], lat_pts, periodic=False)
    j0, j1, wx = _axis_weights(offset[lon_order], points, periodic=periodic)

    def corner(i: np.ndarray, j: np.ndarray) -> xr.DataArray:
        at = {LAT: xr.DataArray(lat_order[i], dims=dim), LON: xr.DataArray(lon_order[j], dims=dim)}
        return field.drop_vars([c for c in (LAT, LON) if c in field.coords]).isel(at)

    wy_, wx_ = xr.DataArray(wy, dims=dim), xr.DataArray(wx, dims=dim)
    out = ((1 - wy_) * ((1 - wx_) * corner(i0, j0) + wx_ * corner(i0, j1))
           + wy_ * ((1 - wx_) * corner(i1, j0) + wx_ * corner(i1, j1)))
    out = out.transpose(*[d for d in field.dims if d not in (LAT, LON)], dim)
    return out.assign_coords({LAT: (dim, lat_pts), LON: (dim, lon_pts)}).rename(field.name)


# ---------------------------------------------------------------- station forecasts

def read_station_forecasts(path: str | Path, what: str = "stations") -> pd.DataFrame:
    """A station forecast Parquet file (or dataset directory), at a path or a URL, as a DataFrame of `COLUMNS`,
    checked: init_time datetime64[ns], lead_time int hours, one row per (init_time, lead_time, station, variable)."""
    import pyarrow.dataset as pads

    p = location.spelled(path)
    if not location.reachable(p, what):
        raise DataError(f"{what} {p} does not exist")
    fs, inside = location.arrow_filesystem(p)
    try:
        table = pads.dataset(inside, filesystem=fs, format="parquet").to_table()
    except Exception as e:  # pyarrow raises several types for a file that is not Parquet
        raise DataError(f"{what} {p} cannot be read as Parquet ({first_line(e)})") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(f"{what} {p}: missing column(s) {', '.join(missing)} "
                        f"(has: {', '.join(table.column_names) or 'none'})")
    return check_station_forecasts(table.select(list(COLUMNS)).to_pandas(), f"{what} {p}")


def check_station_forecasts(df: pd.DataFrame, what: str) -> pd.DataFrame:
    """The table in canonical dtypes; DataError on no rows, non-whole-hour leads, NaN values or duplicate keys."""
    if df.empty:
        raise DataError(f"{what}: no rows")
    df = df.loc[:, list(COLUMNS)].copy()
    try:
        df[INIT] = pd.to_datetime(df[INIT]).astype("datetime64[ns]")
    except (ValueError, TypeError) as e:
        raise DataError(f"{what}: column init_time is not a time ({e})") from None
    lead = df[LEAD]
    if np.issubdtype(lead.dtype, np.timedelta64):
        lead = lead / pd.Timedelta(hours=1)
    lead = pd.to_numeric(lead, errors="coerce")
    bad = lead.isna() | (lead != np.round(lead))
    if bad.any():
        raise DataError(f"{what}: lead_time must be whole hours, got {df['lead_time'][bad].iloc[0]!r}")
    df[LEAD] = lead.astype(np.int64)
    for c in ("station", "variable"):
        df[c] = df[c].astype(str)
    for c in ("latitude", "longitude", "value"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(np.float64)
    nan = df["value"].isna()
    if nan.any():
        r = df[nan].iloc[0]
        raise DataError(f"{what}: {int(nan.sum())} NaN value(s) (first: station {r.station}, {r.variable}, "
                        f"init {r.init_time}, lead {r.lead_time} h)")
    dup = df.duplicated(KEYS)
    if dup.any():
        r = df[dup].iloc[0]
        raise DataError(f"{what}: duplicate row for station {r.station}, {r.variable}, init {r.init_time}, "
                        f"lead {r.lead_time} h (expected one per init_time, lead_time, station, variable)")
    return df.reset_index(drop=True)


def _fields(ds: xr.Dataset, names: list[str] | None) -> dict[str, xr.DataArray]:
    """Channel name -> field without a level dim (`geopotential_500` from geopotential's level 500)."""
    out = {}
    for v, da in ds.data_vars.items():
        if LEVEL in da.dims:
            for lv in da[LEVEL].values:
                out[f"{v}_{int(lv)}"] = da.sel({LEVEL: lv}, drop=True)
        else:
            out[str(v)] = da
    if names is None:
        return out
    missing = [n for n in names if n not in out]
    if missing:
        raise DataError(f"no channel {', '.join(missing)} in the gridded forecast (has: {', '.join(out)})")
    return {n: out[n] for n in names}


def station_forecasts_from_grid(forecast_ds: xr.Dataset, stations_table: pd.DataFrame,
                                variables: list[str] | None = None) -> pd.DataFrame:
    """The station forecast table (`COLUMNS`) of a gridded forecast in the forecast convention (dims init_time,
    lead_time, [members], [level], latitude, longitude): each channel bilinearly interpolated to the stations
    of `stations_table` (columns station, latitude, longitude; one position per station). An ensemble gives
    its ensemble mean (the deterministic forecast of the ensemble). `variables`: channel names, default all."""
    st = stations_table.loc[:, ["station", "latitude", "longitude"]].astype({"station": str})
    st = st.drop_duplicates()
    moved = st["station"].duplicated()
    if moved.any():
        raise DataError(f"station {st['station'][moved].iloc[0]} has more than one position; the bilinear "
                        f"baseline needs fixed stations")
    hours = forecast_ds[LEAD].values / HOUR
    if not np.allclose(hours, np.round(hours)):
        raise DataError(f"gridded forecast: lead_time {hours[hours != np.round(hours)][0]:g} h is not whole hours")
    inits, leads = forecast_ds[INIT].values, np.round(hours).astype(np.int64)
    parts = []
    for name, da in _fields(forecast_ds, variables).items():
        members = [d for d in MEMBER_DIMS if d in da.dims]
        if members:
            da = da.astype(np.float64).mean(members)
        at = bilinear_at_points(da, st["latitude"].values, st["longitude"].values).transpose(INIT, LEAD, "point")
        values = np.asarray(at.values, dtype=np.float64)
        ii, ll, kk = np.meshgrid(np.arange(inits.size), np.arange(leads.size), np.arange(len(st)), indexing="ij")
        parts.append(pd.DataFrame({
            INIT: inits[ii.ravel()], LEAD: leads[ll.ravel()],
            "station": st["station"].values[kk.ravel()], "latitude": st["latitude"].values[kk.ravel()],
            "longitude": st["longitude"].values[kk.ravel()], "variable": name, "value": values.ravel()}))
    return check_station_forecasts(pd.concat(parts, ignore_index=True), "bilinear baseline")


def bilinear_baseline(forecast_ds: xr.Dataset, stations: pd.DataFrame, what: str) -> pd.DataFrame:
    """`station_forecasts_from_grid` at the inits, leads, stations and variables of `stations` (a station
    forecast table); the gridded forecast must have every one of its inits and leads."""
    inits = pd.DatetimeIndex(np.unique(stations[INIT].values))
    leads = np.unique(stations[LEAD].values)
    have_leads = forecast_ds[LEAD].values / HOUR
    missing_i = inits.difference(pd.DatetimeIndex(forecast_ds[INIT].values))
    missing_l = [int(h) for h in leads if not np.any(np.isclose(have_leads, h))]
    if len(missing_i) or missing_l:
        first = f"init_time {missing_i[0]}" if len(missing_i) else f"lead_time {missing_l[0]} h"
        raise DataError(f"{what}: lacks {len(missing_i)} init_time and {len(missing_l)} lead_time values of the "
                        f"station forecast (first: {first})")
    sel = forecast_ds.sel({INIT: inits.values, LEAD: leads.astype("timedelta64[h]").astype("timedelta64[ns]")})
    try:
        return station_forecasts_from_grid(sel, stations, sorted(stations["variable"].unique()))
    except DataError as e:
        raise DataError(f"{what}: {e}") from None


def attach_baseline(paired: pd.DataFrame, baseline: pd.DataFrame, what: str) -> pd.DataFrame:
    """`paired` with a `baseline` column: the baseline's value for each scored row, all of which it must have."""
    merged = paired.merge(baseline[KEYS + ["value"]].rename(columns={"value": "baseline"}), on=KEYS, how="left")
    gap = merged["baseline"].isna()
    if gap.any():
        r = merged[gap].iloc[0]
        raise DataError(f"{what}: lacks {int(gap.sum())} of the {len(merged)} scored station forecasts (first: "
                        f"station {r.station}, {r.variable}, init {r.init_time}, lead {r.lead_time} h); "
                        f"comparisons need the same rows")
    return merged


# ---------------------------------------------------------------- scores

def station_scores(paired: pd.DataFrame) -> xr.Dataset:
    """Scores of paired rows (`pair_with_truth`; with a `baseline` column also the baseline's on the same rows):
    `rmse`, `bias`, `mae`, `count` (variable, lead_time [h]); `station_rmse`, `station_count` (variable, station)
    over all inits and leads, with coords `station_latitude`, `station_longitude`; with a baseline
    `baseline_rmse/bias/mae`, `baseline_station_rmse` and `rel_diff` = rmse / baseline_rmse - 1."""
    models = [("", "value")] + ([("baseline_", "baseline")] if "baseline" in paired else [])
    frames, station_frames = [], []
    for prefix, col in models:
        e = (paired[col] - paired["truth"]).astype(np.float64)
        d = paired[["variable", LEAD, "station"]].assign(e2=e**2, e=e, ae=e.abs())
        agg = d.groupby(["variable", LEAD]).agg(mse=("e2", "mean"), bias=("e", "mean"),
                                                       mae=("ae", "mean"), count=("e", "size"))
        per = d.groupby(["variable", "station"]).agg(mse=("e2", "mean"), count=("e", "size"))
        lead = pd.DataFrame({f"{prefix}rmse": np.sqrt(agg["mse"]), f"{prefix}bias": agg["bias"],
                             f"{prefix}mae": agg["mae"]})
        station = pd.DataFrame({f"{prefix}station_rmse": np.sqrt(per["mse"])})
        if not prefix:  # the counts are the same for the baseline: same rows
            lead["count"], station["station_count"] = agg["count"], per["count"]
        frames.append(lead)
        station_frames.append(station)
    out = xr.merge([pd.concat(frames, axis=1).to_xarray(), pd.concat(station_frames, axis=1).to_xarray()])
    for c in ("count", "station_count"):
        out[c] = out[c].fillna(0).astype(np.int64)
    pos = paired.drop_duplicates("station").set_index("station")
    out = out.assign_coords(station_latitude=("station", pos.loc[out["station"].values, "latitude"].values),
                            station_longitude=("station", pos.loc[out["station"].values, "longitude"].values))
    out[LEAD].attrs["units"] = "hours"
    if "baseline_rmse" in out:
        out["rel_diff"] = out["rmse"] / out["baseline_rmse"] - 1
        out.attrs["rel_diff_convention"] = REL_DIFF_CONVENTION
    out.attrs["n_pairs"] = len(paired)
    return out


def scores_table(scores: xr.Dataset) -> pd.DataFrame:
    """One row per (variable, lead_time): count and every per-lead score (the stations.csv layout)."""
    names = [v for v in scores.data_vars if set(scores[v].dims) == {"variable", LEAD}]
    t = scores[names].to_dataframe().reset_index().rename(columns={LEAD: "lead_hours"})
    cols = ["variable", "lead_hours", "count"] + [c for c in names if c != "count"]
    return t.loc[t["count"] > 0, cols].reset_index(drop=True)


def scores_summary(scores: xr.Dataset) -> dict[str, Any]:
    """The RESULT block: per variable `rmse`/`bias`/`mae`/`count` (and `baseline_rmse`, `rel_diff`) keyed by
    lead ("24h"), plus counts and, with a baseline, the mean rel_diff over variables and leads."""
    per_var: dict[str, Any] = {}
    fields = [f for f in ("rmse", "bias", "mae", "count", "baseline_rmse", "rel_diff") if f in scores]
    for v in scores["variable"].values:
        s = scores.sel(variable=v)
        keep = s["count"].values > 0
        leads = s[LEAD].values[keep]
        per_var[str(v)] = {f: {f"{int(h)}h": (int(x) if f == "count" else float(x))
                               for h, x in zip(leads, s[f].values[keep])} for f in fields}
    out: dict[str, Any] = {"n_pairs": int(scores.attrs["n_pairs"]), "n_stations": int((scores["station_count"] > 0)
                           .any("variable").sum()), "leads_h": [int(h) for h in scores[LEAD].values],
                           "variables": per_var}
    if "rel_diff" in scores:
        out["rel_diff_convention"] = REL_DIFF_CONVENTION
        out["mean_rel_diff.rmse"] = float(scores["rel_diff"].mean(skipna=True))
    return out


# ---------------------------------------------------------------- one evaluation

def station_evaluation(path: str | Path, obs_dir: str | Path, stream: str, *, gridded: xr.Dataset | None = None,
                       gridded_name: str = "the gridded forecast", baseline: str | Path = "") -> xr.Dataset:
    """`station_scores` of the station forecast at `path` against point stream `stream` of `obs_dir`; with
    `gridded` (forecast convention) against its bilinear interpolation, or with `baseline` against a second
    station forecast file, on the same pairs. attrs `forecast`, `truth`, `baseline` name the inputs."""
    what = f"stations {path}"
    paired = pair_with_truth(read_station_forecasts(path), obs_dir, stream, what)
    name = ""
    if gridded is not None:
        name = f"bilinear interpolation of {gridded_name}"
        paired = attach_baseline(paired, bilinear_baseline(gridded, paired, f"station_baseline {name}"),
                                 f"station_baseline {name}")
    elif baseline:
        name = f"station_baseline {baseline}"
        paired = attach_baseline(paired, read_station_forecasts(baseline, "station_baseline"), name)
    scores = station_scores(paired)
    scores.attrs.update(forecast=what, truth=f"stream {stream} of {obs_dir}", baseline=name)
    return scores


def log_station_metrics(scores: xr.Dataset, tracker) -> None:
    """MLflow metrics `stations/rmse/<variable>` (and `stations/rel_diff/<variable>`), step = lead in hours."""
    for h in scores[LEAD].values:
        s = scores.sel(lead_time=h)
        tracker.log_metrics({f"stations/{m}/{v}": float(s[m].sel(variable=v)) for m in ("rmse", "rel_diff") if m in s
                             for v in s["variable"].values if s["count"].sel(variable=v) > 0}, step=int(h))


def station_report(path: str | Path, obs_dir: str | Path, stream: str, forecast: xr.Dataset | None = None,
                   tracker=None) -> dict[str, Any]:
    """The RESULT `stations` block (`scores_summary` and the input names) of a station forecast file, beside
    the bilinear interpolation of `forecast` when given; metrics logged to `tracker` when given."""
    scores = station_evaluation(path, obs_dir, stream, gridded=forecast)
    if tracker is not None:
        log_station_metrics(scores, tracker)
    return {**{k: str(scores.attrs[k]) for k in ("forecast", "truth", "baseline")}, **scores_summary(scores)}
