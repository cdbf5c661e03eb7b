"""The end-to-end system's windows: per analysis time, the observations of every stream plus the state.

A window is named by its anchor t (an index into the store's time axis), as for the forecaster
(`windows.py`, history 1): one row holds

    x        (V + K, h, w)  the true state at t, normalised, then the K constant fields (the processor's input)
    y        (V, h, w)      the normalised tendency from t to t + lead (the processor's target)
    static   (S, h, w)      the encoder's fixed inputs: constant fields, the climatology at t (normalised like
                            the state) and four time planes (sin/cos of day-of-year and of hour)
    obs.<stream>.*          the stream's observations with t - W * step < time <= t (`wxray.data.obs`)
    anchor

The Ray Dataset of these rows (`platform.train.datasets.e2e_dataset`) is built as the forecaster's (anchors,
shuffled once, then a `map_batches` read task per block of anchors), so the exactly-once sharding across Train
workers and the train/val/test time splits are those of the forecaster. Why anchors and not
`ray.data.read_parquet` over the point streams: a row must join every stream and the gridded state at one
time; reading the streams row-wise would need a groupby-shuffle of every observation each epoch, while a read
task that gets a block of anchors reads just the day partitions those anchors need, with the `day` and `time`
filters pushed down into the Parquet scan (`ObsWindowReader`), and each observation of an epoch's windows is
read once (window_steps = 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import xarray as xr

from wxray.config import InPath, NonNegInt, PosInt
from wxray.console import say
from wxray.data import location
from wxray.data.obs.kinds import kind_of, station_kinds
from wxray.data.obs.points import ALTITUDE
from wxray.data.obs.registry import REGISTRY, ObsSpec, StreamInfo, make_obs_spec
from wxray.data.obs.sample import make_sample_obs
from wxray.data.obs.windows import ObsWindowReader
from wxray.data.schema import LAT, LEVEL, LON, TIME, open_climatology, time_step
from wxray.data.window_data import DataConfig, WindowData, prepare_windows
from wxray.data.windows import WindowReader, WindowSpec, fit_spec, open_lazy
from wxray.errors import ConfigError, DataError
from wxray.io import resolve_path

DEFAULT_SAMPLE_OBS = "data/sample_obs"


@dataclass
class ObsDataConfig(DataConfig):
    obs_dir: InPath = DEFAULT_SAMPLE_OBS  # observation streams (obs.yaml); the default is derived from the sample
    streams: list[str] = field(default_factory=list)  # streams the encoder reads; [] = every stream in obs.yaml
    window_steps: PosInt = 1  # assimilation window: observations with t - window_steps * step < time <= t
    max_quality: Literal[0, 1, 2] = 0  # keep observations whose quality flag <= this (0 good, 1 suspect, 2 bad)
    station_stream: str = "stations"  # the point stream the decoder forecasts and station scores use
    station_variables: list[str] = field(default_factory=list)  # decoder outputs; [] = the stream's variables
    obs_seed: NonNegInt = 0  # seed of the sample streams derived at the default obs_dir

    def validate(self) -> None:
        super().validate()
        if self.history != 1:
            raise ConfigError(f"data.history={self.history}: the end-to-end processor steps one analysed state "
                              "(history 1)")


N_TIME_FEATURES = 4


@dataclass
class E2EData:
    windows: WindowData
    obs: ObsSpec
    station_stream: str
    station_variables: list[str]
    station_altitude: bool = False  # the station stream has heights: the decoder's extra feature

    @property
    def spec(self) -> WindowSpec:
        return self.windows.spec

    @property
    def n_static(self) -> int:
        return len(self.spec.constants) + len(self.spec.inputs) + N_TIME_FEATURES

    def counts(self) -> dict[str, int]:
        return self.windows.counts()


def _ensure_obs(cfg: ObsDataConfig) -> str:
    """The obs dir (a path or a URL, read in place); only the default local one is derived when missing."""
    obs_dir = cfg.obs_dir
    if location.reachable(location.join(obs_dir, REGISTRY), "data.obs_dir"):
        return obs_dir
    local = None if location.is_remote(obs_dir) else location.local_path(obs_dir)
    if local is None or local.resolve() != resolve_path(DEFAULT_SAMPLE_OBS).resolve():
        raise DataError(f"data.obs_dir {local or obs_dir}: no obs.yaml there (make one with jobs/make_sample_obs.py "
                        f"or jobs/prepare_obs.py)")
    say(f"deriving the sample observation streams {local} from {cfg.store} (synthetic; a few seconds)")
    make_sample_obs(cfg.store, local, seed=cfg.obs_seed)
    return str(local)


def prepare_e2e(cfg: ObsDataConfig, patch_size: int) -> E2EData:
    """Store windows (history 1), the stream spec and the station variables, all checked on the driver."""
    windows = prepare_windows(cfg)
    windows.spec = fit_spec(windows.spec, patch_size, cfg.grid_fit)
    ds = open_lazy(windows.spec.store)
    obs_dir = _ensure_obs(cfg)
    obs = make_obs_spec(obs_dir, time_step(ds), window_steps=cfg.window_steps, streams=cfg.streams,
                        max_quality=cfg.max_quality)
    station = station_info(obs, cfg.station_stream, "data.station_stream")
    variables = list(cfg.station_variables) or list(station.variables)
    for v in variables:
        if v not in station.variables:
            raise ConfigError(f"data.station_variables names '{v}', not a variable of stream "
                              f"'{station.name}' ({', '.join(station.variables)})")
    has_alt = ALTITUDE in kind_of(station).keys(station, obs.obs_dir)
    return E2EData(windows=windows, obs=obs, station_stream=station.name, station_variables=variables,
                   station_altitude=has_alt)


def station_info(obs: ObsSpec, name: str, key: str) -> StreamInfo:
    """Stream `name` of `obs`, which must be of a kind holding station reports (config key `key`)."""
    for s in obs.streams:
        if s.name == name:
            if not kind_of(s).stations:
                raise ConfigError(f"{key}={name} is a {s.kind} stream; stations need a "
                                  f"{' or '.join(station_kinds())} stream")
            return s
    raise ConfigError(f"{key}={name} is not a stream the encoder reads ({', '.join(s.name for s in obs.streams)})")


def time_features(times: np.ndarray) -> np.ndarray:
    """(b, 4): sin/cos of the day of year and of the hour of day."""
    t = np.asarray(times, dtype="datetime64[ns]")
    doy = (t - t.astype("datetime64[Y]")).astype("timedelta64[s]").astype(np.float64) / 86400.0
    hour = (t - t.astype("datetime64[D]")).astype("timedelta64[s]").astype(np.float64) / 3600.0
    a, b = 2 * np.pi * doy / 365.25, 2 * np.pi * hour / 24.0
    return np.stack([np.sin(a), np.cos(a), np.sin(b), np.cos(b)], axis=1).astype(np.float32)


class E2EReader:
    """{"anchor": (b,)} -> one batch of end-to-end rows (see the module docstring)."""

    def __init__(self, spec: WindowSpec, obs: ObsSpec):
        self.spec, self.obs = spec, obs
        self.windows = WindowReader(spec)
        self.observations = ObsWindowReader(obs)
        self._clim: xr.Dataset | None = None

    def _climatology(self, times: np.ndarray) -> np.ndarray:
        """(b, V, h, w) climatology at `times`, normalised like the inputs; zeros when the store has none."""
        s = self.spec
        out = np.zeros((len(times), len(s.inputs), *s.grid), dtype=np.float32)
        if self._clim is None:
            self._clim = open_climatology(s.store)
            if self._clim is None:
                self._clim = xr.Dataset()
        if not self._clim.data_vars:
            return out
        t = xr.DataArray(np.asarray(times, dtype="datetime64[ns]"), dims=TIME)
        doy, hour = t.dt.dayofyear, t.dt.hour
        for i, ch in enumerate(s.inputs):
            if ch.variable not in self._clim:
                continue
            da = self._clim[ch.variable]
            if ch.level is not None and LEVEL in da.dims:
                da = da.sel({LEVEL: ch.level})
            da = da.isel({LAT: slice(*s.fit.rows), LON: slice(*s.fit.cols)})
            da = da.sel(dayofyear=doy, hour=hour, method="nearest")
            field = (np.asarray(da.values, dtype=np.float32) - s.in_mean[i]) / s.in_std[i]
            out[:, i] = s.pad(field)
        return out

    def static(self, times: np.ndarray, x: np.ndarray) -> np.ndarray:
        s = self.spec
        consts = x[:, len(s.inputs):]
        tf = time_features(times)[:, :, None, None] * np.ones((1, 1, *s.grid), dtype=np.float32)
        return np.concatenate([consts, self._climatology(times), tf], axis=1).astype(np.float32)

    def times(self, anchors: np.ndarray) -> np.ndarray:
        return open_lazy(self.spec.store)[TIME].values[np.asarray(anchors, dtype=np.int64)]

    def inputs(self, anchors: np.ndarray) -> dict[str, np.ndarray]:
        """Everything but the target: for analyses and forecasts from inits whose future is not in the store."""
        anchors = np.asarray(anchors, dtype=np.int64)
        times = self.times(anchors)
        x = self.windows.inputs(anchors)
        return {"x": x, "static": self.static(times, x), **self.observations(times), "anchor": anchors}

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        anchors = np.asarray(batch["anchor"], dtype=np.int64)
        row = self.windows({"anchor": anchors})
        times = self.times(anchors)
        return {**row, "static": self.static(times, row["x"]), **self.observations(times)}
