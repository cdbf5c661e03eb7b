"""Synthetic observation streams derived from a store (by default the embedded shallow-water sample).

    make_sample_obs("data/sample_32x64.zarr", "data/sample_obs", seed=0)

Every value is the store's state interpolated bilinearly (longitude wrapped) to the observation's place,
plus Gaussian noise of the stream's documented std (obs.yaml `noise`); the truth stays in the store
(`source_store` in obs.yaml), so analyses and forecasts are verified against it. Streams:

* `stations` (point): ~300 fixed sites, 75% inside three 'continent' boxes (dense), the rest spread over
  the remaining sphere (sparse); they report at the store's step times, ~10% of reports missing, 2% of values
  missing, 3% of reports flagged suspect (quality 1, one variable off by 4-8 store std: gross errors) and 0.5%
  bad (quality 2, every variable off); an `altitude` column (m, from a smooth orography over the continents;
  NaN for 2% of sites). Land stations see the grid state as stations do, with representativeness error:
  winds slowed by friction over the continents and geopotential lowered by the station height
  (`_representativeness`), so station truth is not the grid interpolated (a decoder has something to learn).
* `ships` (point): ~60 platforms sailing the sparse regions; report times jittered uniformly inside the step
  (t - step, t], the truth interpolated linearly in time within a trajectory; 15% of reports missing,
  noise 1.5x the stations'; 2% suspect.
* `profiles` (point): ~40 radiosonde-like sites (half in the boxes), every other step, several variables,
  each value missing with 10%; on a store with pressure levels one row per level (`level` column, the
  store levels nearest 850/500/250 hPa); noise 0.7x the stations'.
* `swath_tb` (gridded, own 24x48 grid offset by half a cell): a brightness-temperature-like nonlinear
  function of the state, 250 + 25 tanh(z') - 6 min(zeta'^2, 9) K (z', zeta' the store-normalised
  geopotential and vorticity), noise 1 K, seen where its polar orbiter (half-width 6 deg) flew during the
  step (~38% of the pixels a step), 3% of those dropped (cloud/rain).
* `swath_wind` (gridded, same grid): wind speed |(u, v)|, noise 2 m/s (clipped at 0), from another orbiter
  (its nodes 90 deg away) with a wider swath (half-width 12 deg, ~62% of the pixels a step): noisier but
  denser than swath_tb.

Variables: stations, ships and profiles observe the store's geopotential and winds (10 m winds, 2 m
temperature, MSLP when the store has them; fields with levels at the store's highest-pressure level for
surface streams). Gridded streams hold every store step, the orbits of (t - step, t] binned at t.
Seeded and deterministic: each stream draws from its own `numpy.random.SeedSequence([seed, k])`, so the
same seed gives byte-identical files. The whole obs dir is written into a temporary sibling and renamed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wxray.data.obs.gridded import write_gridded
from wxray.data.obs.kinds.gridded import GRIDDED
from wxray.data.obs.kinds.point import POINT, POINTS_PATH
from wxray.data.obs.points import (
    ALTITUDE,
    LAT,
    LEVEL,
    LON,
    QUALITY,
    STATION,
    TIME,
    max_per_step,
    point_stats,
    report_times,
    to_table,
    write_point_stream,
)
from wxray.data.obs.registry import Registry, StreamInfo, write_registry
from wxray.data.obs.synth import between, bilinear, orography, place_stations, ship_tracks, swath_mask
from wxray.data.sample import ensure_sample_store
from wxray.data.schema import GLOBAL, TRAJECTORY, grid_kind, open_stats, open_store, time_step
from wxray.data.schema import LEVEL as STORE_LEVEL
from wxray.errors import DataError
from wxray.io import atomic_path, resolve_path
from wxray.sizes import check_memory

DEFAULT_STORE = "data/sample_32x64.zarr"
STREAM_KEYS = {"stations": 1, "ships": 2, "profiles": 3, "swath_tb": 4, "swath_wind": 5}
SURFACE = ("10m_u_component_of_wind", "10m_v_component_of_wind", "2m_temperature", "mean_sea_level_pressure")
BASE = ("geopotential", "u_component_of_wind", "v_component_of_wind")
PROFILE_VARS = ("geopotential", "temperature", "u_component_of_wind", "v_component_of_wind", "specific_humidity")
PROFILE_LEVELS = (850, 500, 250)
# nominal station noise (physical units); other streams scale it
NOISE = {"geopotential": 50.0, "u_component_of_wind": 1.5, "v_component_of_wind": 1.5, "temperature": 0.5,
         "2m_temperature": 1.0, "10m_u_component_of_wind": 1.5, "10m_v_component_of_wind": 1.5,
         "mean_sea_level_pressure": 80.0, "specific_humidity": 3e-4, "vorticity": 2e-6}
TB_NOISE, WIND_NOISE = 1.0, 2.0  # K, m/s
TB_HALF_WIDTH, WIND_HALF_WIDTH = 6.0, 12.0  # degrees of great circle either side of the ground track


@dataclass
class SampleObsResult:
    obs_dir: Path
    source_store: str
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def figures(self) -> dict[str, Any]:
        return {"obs_dir": str(self.obs_dir), "source_store": self.source_store, "streams": self.streams,
                "n_obs": int(sum(s["n_obs"] for s in self.streams.values())), "seconds": round(self.seconds, 2)}


class Truth:
    """The store's fields in memory (float32, (T, h, w) each) and bilinear / time interpolation of them."""

    def __init__(self, store: Path):
        ds = open_store(store)
        if grid_kind(ds["longitude"].values) != GLOBAL:
            raise DataError(f"store {store}: sample observations need a global grid (interpolation wraps longitude)")
        self.ds, self.stats = ds, open_stats(store)
        self.times = ds["time"].values.astype("datetime64[ns]")
        self.step = time_step(ds).astype("timedelta64[ns]")
        self.step_hours = float(self.step / np.timedelta64(1, "h"))
        traj = ds[TRAJECTORY].values if TRAJECTORY in ds.coords else np.zeros(len(self.times), np.int64)
        # a step whose predecessor is in another trajectory (or none) cannot interpolate back in time
        self.first = np.r_[True, np.asarray(traj)[1:] != np.asarray(traj)[:-1]]
        self.lat, self.lon = ds["latitude"].values, ds["longitude"].values
        self._cache: dict[tuple[str, int | None], np.ndarray] = {}

    @property
    def n_times(self) -> int:
        return len(self.times)

    def has(self, var: str, levelled: bool | None = None) -> bool:
        if var not in self.ds.data_vars or "time" not in self.ds[var].dims:
            return False
        return levelled is None or (STORE_LEVEL in self.ds[var].dims) == levelled

    def levels(self) -> list[int]:
        return [int(x) for x in self.ds[STORE_LEVEL].values] if STORE_LEVEL in self.ds.coords else []

    def surface_level(self, var: str) -> int | None:
        return max(self.levels()) if STORE_LEVEL in self.ds[var].dims else None

    def field(self, var: str, level: int | None = None) -> np.ndarray:
        key = (var, level)
        if key not in self._cache:
            da = self.ds[var]
            if STORE_LEVEL in da.dims:
                da = da.sel({STORE_LEVEL: level if level is not None else self.surface_level(var)})
            self._cache[key] = np.asarray(da.transpose("time", "latitude", "longitude").values, np.float32)
        return self._cache[key]

    def std(self, var: str) -> float:
        s = self.stats.std[var]
        return float(s.max()) if s.ndim else float(s)

    def at(self, var, level, t, lat, lon) -> np.ndarray:
        return bilinear(self.field(var, level), self.lat, self.lon, t, lat, lon)

    def at_time(self, var, level, k, frac, lat, lon) -> np.ndarray:
        """The state at t_k - (1 - frac) step: linear between steps k-1 and k of one trajectory (step k if first)."""
        now = self.at(var, level, k, lat, lon)
        prev = self.at(var, level, np.maximum(k - 1, 0), lat, lon)
        f = np.where(self.first[k], 1.0, frac)
        return f * now + (1 - f) * prev


def _rng(seed: int, stream: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, STREAM_KEYS[stream]]))


def _noise(tr: Truth, var: str, factor: float) -> float:
    """The stream's noise std of `var`: `factor` x the station noise (2% of the store std if not in NOISE)."""
    return float(f"{factor * NOISE.get(var, 0.02 * tr.std(var)):.6g}")


def _surface_vars(tr: Truth) -> list[str]:
    surf = [v for v in SURFACE if tr.has(v, levelled=False)]
    out = surf or [v for v in BASE if tr.has(v)]
    if not out:
        raise DataError(f"store: sample observations need some of {', '.join(SURFACE + BASE)} "
                        f"(has: {', '.join(map(str, tr.ds.data_vars))})")
    return out


def _corrupt(rng, df: pd.DataFrame, variables: list[str], tr: Truth, suspect: float, bad: float) -> np.ndarray:
    """Quality flags; flagged reports get gross errors (4-8 store std): one variable when suspect, all when bad."""
    n = len(df)
    u = rng.random(n)
    q = np.where(u < suspect, 1, np.where(u < suspect + bad, 2, 0)).astype(np.int8)
    which = rng.integers(0, len(variables), n)
    size = rng.uniform(4.0, 8.0, (n, len(variables))) * rng.choice([-1.0, 1.0], (n, len(variables)))
    for j, v in enumerate(variables):
        hit = (q == 2) | ((q == 1) & (which == j))
        x = df[v].to_numpy(dtype=np.float64, copy=True)
        x[hit] += size[hit, j] * tr.std(v)
        df[v] = x.astype(np.float32)
    return q


def _stations(tr: Truth, rng, n: int, missing: float, suspect: float) -> tuple[pd.DataFrame, list[str], float]:
    variables = _surface_vars(tr)
    lat, lon, dense = place_stations(rng, n)
    height = orography(lat, lon) * rng.uniform(0.8, 1.2, n)  # a site is not at its grid box's mean height
    alt = height.astype(np.float32)
    alt[rng.random(n) < 0.02] = np.nan
    t, s = (x.ravel() for x in np.meshgrid(np.arange(tr.n_times), np.arange(n), indexing="ij"))
    keep = rng.random(t.size) >= missing
    t, s = t[keep], s[keep]
    df = pd.DataFrame({TIME: tr.times[t], STATION: np.array([f"ST{i:04d}" for i in range(n)])[s],
                       LAT: lat[s], LON: lon[s], ALTITUDE: alt[s]})
    for v in variables:
        x = representativeness(v, tr.at(v, None, t, lat[s], lon[s]), dense[s], height[s])
        x = x + _noise(tr, v, 1.0) * rng.standard_normal(t.size)
        x[rng.random(t.size) < 0.02] = np.nan
        df[v] = x.astype(np.float32)
    df[QUALITY] = _corrupt(rng, df, variables, tr, suspect, 0.005)
    return df, variables, 1.0


def representativeness(var: str, grid_value: np.ndarray, land: np.ndarray, height: np.ndarray) -> np.ndarray:
    """What a land station measures of the grid-box state: winds slowed by surface friction over the continents
    (x 0.7), geopotential lowered by its height above the grid's mean surface (- 0.2 g h). A station decoder
    can learn both from where a station is; bilinear interpolation of the grid cannot."""
    if "wind" in var:
        return grid_value * np.where(land, 0.7, 1.0)
    if var == "geopotential":
        return grid_value - 0.2 * 9.80665 * height
    return grid_value


def _ships(tr: Truth, rng, n: int) -> tuple[pd.DataFrame, list[str], float]:
    variables = _surface_vars(tr)
    plat, plon = ship_tracks(rng, n, tr.n_times, tr.step_hours)
    k, s = (x.ravel() for x in np.meshgrid(np.arange(tr.n_times), np.arange(n), indexing="ij"))
    keep = rng.random(k.size) >= 0.15
    k, s = k[keep], s[keep]
    step_s = int(tr.step / np.timedelta64(1, "s"))
    back = rng.integers(0, step_s, k.size)  # seconds before t_k: times in (t_k - step, t_k]
    frac = 1.0 - back / step_s
    lat, lon = between(plat[np.maximum(k - 1, 0), s], plon[np.maximum(k - 1, 0), s], plat[k, s], plon[k, s],
                       np.where(k == 0, 1.0, frac))
    df = pd.DataFrame({TIME: tr.times[k] - back.astype("timedelta64[s]"),
                       STATION: np.array([f"SHIP{i:03d}" for i in range(n)])[s], LAT: lat, LON: lon,
                       ALTITUDE: np.zeros(k.size, np.float32)})
    for v in variables:
        x = tr.at_time(v, None, k, frac, lat, lon) + _noise(tr, v, 1.5) * rng.standard_normal(k.size)
        x[rng.random(k.size) < 0.02] = np.nan
        df[v] = x.astype(np.float32)
    df[QUALITY] = _corrupt(rng, df, variables, tr, 0.02, 0.0)
    return df, variables, 1.5


def _profiles(tr: Truth, rng, n: int) -> tuple[pd.DataFrame, list[str], list[int], float]:
    levelled = [v for v in PROFILE_VARS if tr.has(v, levelled=True)]
    if levelled:
        have = tr.levels()
        levels = sorted({min(have, key=lambda x: abs(x - p)) for p in PROFILE_LEVELS}, reverse=True)
        variables = levelled
    else:
        levels, variables = [], [v for v in PROFILE_VARS if tr.has(v)] or _surface_vars(tr)
    lat, lon, dense = place_stations(rng, n, dense_share=0.5)
    alt = np.where(dense, rng.gamma(2.0, 200.0, n), rng.gamma(1.0, 40.0, n)).clip(0, 4000).astype(np.float32)
    steps = np.arange(0, tr.n_times, 2)
    t, s = (x.ravel() for x in np.meshgrid(steps, np.arange(n), indexing="ij"))
    keep = rng.random(t.size) >= 0.05
    t, s = t[keep], s[keep]
    lv = levels or [None]
    t, s, li = (np.repeat(t, len(lv)), np.repeat(s, len(lv)), np.tile(np.arange(len(lv)), t.size))
    df = pd.DataFrame({TIME: tr.times[t], STATION: np.array([f"PR{i:03d}" for i in range(n)])[s],
                       LAT: lat[s], LON: lon[s], ALTITUDE: alt[s]})
    if levels:
        df[LEVEL] = np.asarray(levels, np.int32)[li]
    for v in variables:
        x = np.empty(t.size)
        for j, level in enumerate(lv):
            m = li == j
            x[m] = tr.at(v, level, t[m], lat[s[m]], lon[s[m]])
        x += _noise(tr, v, 0.7) * rng.standard_normal(t.size)
        x[rng.random(t.size) < 0.10] = np.nan
        df[v] = x.astype(np.float32)
    df[QUALITY] = _corrupt(rng, df, variables, tr, 0.01, 0.0)
    return df, variables, levels, 0.7


def swath_grid(nlat: int, nlon: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell centres of an nlat x nlon grid (no poles, offset half a cell from 0 E): not a model grid."""
    return -90.0 + (np.arange(nlat) + 0.5) * 180.0 / nlat, (np.arange(nlon) + 0.5) * 360.0 / nlon


def _on_grid(tr: Truth, var: str, level, glat, glon) -> np.ndarray:
    """(T, h, w) of a store field interpolated to the swath grid."""
    la, lo = np.meshgrid(glat, glon, indexing="ij")
    t = np.repeat(np.arange(tr.n_times), la.size)
    x = tr.at(var, level, t, np.tile(la.ravel(), tr.n_times), np.tile(lo.ravel(), tr.n_times))
    return x.reshape(tr.n_times, *la.shape)


def _swath_tb(tr: Truth, rng, glat, glon) -> np.ndarray:
    zvar = "geopotential" if tr.has("geopotential") else str(next(v for v in tr.ds.data_vars if tr.has(v)))
    zlev = min(tr.levels(), key=lambda x: abs(x - 500)) if STORE_LEVEL in tr.ds[zvar].dims else None
    zn = (_on_grid(tr, zvar, zlev, glat, glon) - float(tr.stats.mean[zvar].mean())) / tr.std(zvar)
    tb = 250.0 + 25.0 * np.tanh(zn)
    if tr.has("vorticity"):
        vlev = min(tr.levels(), key=lambda x: abs(x - 500)) if STORE_LEVEL in tr.ds["vorticity"].dims else None
        zeta = _on_grid(tr, "vorticity", vlev, glat, glon) / tr.std("vorticity")
        tb -= 6.0 * np.minimum(zeta**2, 9.0)
    tb += TB_NOISE * rng.standard_normal(tb.shape)
    seen = swath_mask(glat, glon, tr.n_times, tr.step_hours, TB_HALF_WIDTH) & (rng.random(tb.shape) >= 0.03)
    return np.where(seen, tb, np.nan)[:, None].astype(np.float32)


def _swath_wind(tr: Truth, rng, glat, glon) -> np.ndarray:
    pair = next((p for p in (SURFACE[:2], BASE[1:]) if tr.has(p[0]) and tr.has(p[1])), None)
    if pair is None:
        raise DataError(f"store: swath_wind needs u and v winds ({' or '.join(SURFACE[:2] + BASE[1:])})")
    u = _on_grid(tr, pair[0], None, glat, glon)
    v = _on_grid(tr, pair[1], None, glat, glon)
    speed = np.maximum(np.hypot(u, v) + WIND_NOISE * rng.standard_normal(u.shape), 0.0)
    seen = swath_mask(glat, glon, tr.n_times, tr.step_hours, WIND_HALF_WIDTH, node0_deg=90.0, phase=0.5)
    return np.where(seen, speed, np.nan)[:, None].astype(np.float32)


def _point_info(name, df, variables, levels, noise_factor, tr: Truth, description) -> StreamInfo:
    mean, std = point_stats(df, variables, f"sample stream '{name}'")
    noise = {v: _noise(tr, v, noise_factor) for v in variables}
    return StreamInfo(name, POINT, POINTS_PATH, list(variables), list(levels), mean, std, noise,
                      max_per_step(report_times(df), tr.step), description)


def _grid_info(name, values, channel, noise, glat, glon, description) -> StreamInfo:
    x = values[np.isfinite(values)].astype(np.float64)
    return StreamInfo(name, GRIDDED, f"{name}.zarr", [channel], [], {channel: float(x.mean())},
                      {channel: float(x.std())}, {channel: noise}, 0, description, glat, glon)


def make_sample_obs(store: str | Path = DEFAULT_STORE, out: str | Path = "data/sample_obs", seed: int = 0,
                    stations: int = 300, ships: int = 60, profiles: int = 40, swath: tuple[int, int] = (24, 48),
                    missing: float = 0.1, suspect: float = 0.03, overwrite: bool = False) -> SampleObsResult:
    """Derive the five sample streams from `store` into the obs dir `out` (see the module docstring).

    The default store is generated first when missing (`wxray.data.sample.ensure_sample_store`); any other
    store must exist. An existing non-empty `out` is a DataError unless `overwrite`."""
    t0 = time.perf_counter()
    store, out = resolve_path(store), resolve_path(out)
    if not store.exists() and store == resolve_path(DEFAULT_STORE):
        ensure_sample_store(store)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"out {out} already exists (set overwrite=true to replace it)")
    tr = Truth(store)
    if tr.n_times < 2:
        raise DataError(f"store {store}: sample observations need at least 2 time steps")
    # each swath stream holds a few (T, h, w) float64 fields at once (interpolated truth, noise, mask)
    check_memory(2 * 6 * 8 * tr.n_times * swath[0] * swath[1],
                 f"swath_grid={swath[0]}x{swath[1]} over the store's {tr.n_times} time steps", "swath_grid")
    glat, glon = swath_grid(*swath)
    streams: list[StreamInfo] = []
    tables, grids = {}, {}
    if stations:
        df, variables, f = _stations(tr, _rng(seed, "stations"), stations, missing, suspect)
        tables["stations"] = (df, variables)
        streams.append(_point_info("stations", df, variables, [], f, tr,
                                   f"{stations} fixed stations, 75% in three dense 'continent' boxes, the rest sparse; "
                                   f"reports at the store steps, {missing:.0%} missing, {suspect:.0%} suspect "
                                   f"(gross errors), 0.5% bad; altitude column; representativeness: land winds x 0.7, "
                                   f"geopotential - 0.2 g altitude"))
    if ships:
        df, variables, f = _ships(tr, _rng(seed, "ships"), ships)
        tables["ships"] = (df, variables)
        streams.append(_point_info("ships", df, variables, [], f, tr,
                                   f"{ships} ships on tracks across the sparse regions, times jittered inside the "
                                   f"step, 15% missing, 2% suspect; noise 1.5x stations"))
    if profiles:
        df, variables, levels, f = _profiles(tr, _rng(seed, "profiles"), profiles)
        tables["profiles"] = (df, variables)
        where = f"levels {levels} hPa" if levels else "no levels (the store has none)"
        streams.append(_point_info("profiles", df, variables, levels, f, tr,
                                   f"{profiles} radiosonde-like sites every other step, {where}, 10% of values "
                                   f"missing; noise 0.7x stations"))
    grids["swath_tb"] = _swath_tb(tr, _rng(seed, "swath_tb"), glat, glon)
    streams.append(_grid_info("swath_tb", grids["swath_tb"], "brightness_temperature", TB_NOISE, glat, glon,
                              f"brightness-temperature proxy 250 + 25 tanh(z') - 6 min(zeta'^2, 9) K, noise "
                              f"{TB_NOISE:g} K; one polar orbiter, half-width {TB_HALF_WIDTH:g} deg, 3% dropouts; "
                              f"{swath[0]}x{swath[1]} grid"))
    grids["swath_wind"] = _swath_wind(tr, _rng(seed, "swath_wind"), glat, glon)
    streams.append(_grid_info("swath_wind", grids["swath_wind"], "wind_speed", WIND_NOISE, glat, glon,
                              f"wind speed, noise {WIND_NOISE:g} m/s (clipped at 0); a polar orbiter with a wider "
                              f"swath, half-width {WIND_HALF_WIDTH:g} deg (denser than swath_tb); "
                              f"{swath[0]}x{swath[1]} grid"))
    reg = Registry(out, {s.name: s for s in streams}, source_store=str(store))
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        for name, (df, variables) in tables.items():
            write_point_stream(tmp, POINTS_PATH, name, to_table(df, variables))
        for name, values in grids.items():
            write_gridded(tmp / f"{name}.zarr", tr.times, reg.streams[name].variables, glat, glon, values,
                          {"stream": name, "source_store": str(store), "seed": seed})
        write_registry(reg, tmp)
    figures = {}
    for s in streams:
        if s.name in tables:
            n = len(tables[s.name][0])
            figures[s.name] = {"kind": s.kind, "n_obs": n, "n_sites": int(tables[s.name][0][STATION].nunique()),
                               "max_per_step": s.max_per_step, "noise": s.noise}
        else:
            g = grids[s.name]
            figures[s.name] = {"kind": s.kind, "n_obs": int(np.isfinite(g).sum()),
                               "coverage": round(float(np.isfinite(g).mean()), 3), "noise": s.noise}
    return SampleObsResult(out, str(store), figures, time.perf_counter() - t0)
