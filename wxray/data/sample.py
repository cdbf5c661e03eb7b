"""The embedded default dataset: spherical shallow-water flow from torch-harmonics — NOT ERA5.

`generate_sample` integrates the shallow-water equations with `torch_harmonics.examples.ShallowWaterSolver`
(spectral, third-order Adams-Bashforth with implicit hyperdiffusion) on an equiangular grid with poles (32x64
by default) for several independent trajectories, all stepped together as one batch by `batched_timestep` (the
solver's own operators and `dudtspec` / `timestep` scheme, vectorised over trajectories; it reproduces
`ShallowWaterSolver.timestep` to round-off, see the tests). Each 6 h step is `substeps(nlat)` solver steps, a
count set by the stability of that scheme on the fastest resolved gravity wave (it grows faster than nlat).
Each trajectory starts from its own random, nonlinearly balanced state drawn from
`numpy.random.default_rng([seed, k])`: two zonal jets of random latitude, width and speed, random eddies
(streamfunction spectrum peaked near total wavenumber 5) and a few unbalanced height bumps; `spinup_days` are
integrated and discarded, then every 6 h one step is kept. Variables (dims time, latitude, longitude;
float32): `geopotential` (g*h of the layer, m2 s-2), `u_component_of_wind`, `v_component_of_wind` (m s-1),
`vorticity` (relative, s-1). Times are 6-hourly from 2000-01-01T00 and continue across trajectories; the
`trajectory` coordinate keeps windows inside one run. The solver's grid runs north to south: it is flipped so
latitude ascends.

Deterministic for a seed (float64 solver, one torch thread during generation).
"""

from __future__ import annotations

import fcntl
import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from tqdm.auto import tqdm

import wxray
from wxray.data.schema import LAT, LON, TIME, TRAJECTORY, open_stats, open_store
from wxray.data.stats import add_stats
from wxray.data.writer import StoreWriter
from wxray.errors import DataError
from wxray.io import atomic_path

SOURCE = "wxray shallow-water sample (torch-harmonics ShallowWaterSolver); NOT ERA5"
VARIABLES = ("geopotential", "u_component_of_wind", "v_component_of_wind", "vorticity")
STEP_S = 6 * 3600
START = "2000-01-01T00:00"
DEFAULT_GRID = (32, 64)
DEFAULT_DAYS = 25  # x 4 trajectories x 4 steps a day = 400 steps
DEFAULT_TRAJECTORIES = 4
# For `substeps`: the solver's constants (passed to it explicitly: the count is needed before it exists) and the
# stability of its scheme, AB3 with implicit hyperdiffusion, on an oscillation of frequency w.
RADIUS, GRAVITY, HAVG = 6.37122e6, 9.80616, 10.0e3  # m, m s-2, m (mean layer depth)
AB3_SLOPE = 2.09  # AB3 is stable while w*dt <= 0.7236; past it ln|z| per step grows 2.09 per unit of w*dt
COURANT = 0.63  # ~0.7236 * c / (c + 45 m/s), c = sqrt(g H): room for the jets' Doppler shift
HYPERDIFF_TAU = 7200.0  # s: torch-harmonics' hyperdiffusion e-folds the truncation degree in 2 h, whatever dt


@dataclass
class SampleResult:
    store: Path
    n_times: int
    grid: tuple[int, int]
    trajectories: int
    seconds: float

    def figures(self) -> dict:
        return {"store": str(self.store), "variables": list(VARIABLES), "levels": [], "n_times": self.n_times,
                "grid": f"{self.grid[0]}x{self.grid[1]}", "trajectories": self.trajectories,
                "n_missing": 0, "generate_seconds": round(self.seconds, 2)}


@contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def substeps(nlat: int) -> int:
    """Solver steps per 6 h step: n = max(ceil(6 h / (900 s * 32/nlat)), ceil(6 h * (w - 1/(tau S)) / C)).

    w = sqrt(g H L (L-1)) / R is the fastest resolved gravity wave (degree L-1, L = (nlat + 1) // 2). Once w dt
    passes 0.72, AB3 grows it by ln|z| ~ S (w dt - 0.72) a step while the implicit hyperdiffusion takes dt/tau
    off it a step; the invariant kept is w dt <= C + (dt/tau)/S, C = 0.63 leaving room for the jets' Doppler
    shift. The damping credit dt/tau shrinks with dt, so n grows faster than nlat: 24 (900 s) at 32x64 as
    before; 51 at 64x128 and 105 at 128x256, where the former 900 s * 32/nlat (48, 96) held w dt near 0.7 as at
    32x64: twice the steps an hour, twice AB3's growth an hour against the same damping, and a blow-up within
    days. The first term keeps coarser grids as they were (16x32: 12). Checked: 36 trajectories x 30 days at
    32x64, 32 x 10 days at 64x128 and 16 x 4 days at 128x256 stay smooth; 23 steps at 32x64 lose 8 of 32.
    """
    ell = (nlat + 1) // 2
    w = math.sqrt(GRAVITY * HAVG * ell * (ell - 1)) / RADIUS
    cfl = math.ceil(STEP_S * (w - 1.0 / (HYPERDIFF_TAU * AB3_SLOPE)) / COURANT)
    return max(math.ceil(STEP_S / (900.0 * 32 / nlat)), cfl)


def _solver(nlat: int, nlon: int):
    import torch  # noqa: F401  (torch-harmonics needs it)
    from torch_harmonics.examples import ShallowWaterSolver

    lmax = (nlat + 1) // 2
    n_sub = substeps(nlat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = ShallowWaterSolver(nlat, nlon, STEP_S / n_sub, lmax=lmax, mmax=min(lmax, nlon // 2 + 1),
                               grid="equiangular", radius=RADIUS, gravity=GRAVITY, havg=HAVG)
    return s, n_sub


def _initial_state(s, rng: np.random.Generator):
    """A random, nonlinearly balanced state: jets + eddies + unbalanced height bumps (spectral)."""
    import torch

    nlat, nlon = s.nlat, s.nlon
    lat = s.lats.reshape(-1, 1).expand(nlat, nlon)
    lon = s.lons.reshape(1, -1).expand(nlat, nlon)
    u = torch.zeros(nlat, nlon, dtype=torch.float64)
    for sign in (1.0, -1.0):
        phi, width = math.radians(rng.uniform(30, 55)), math.radians(rng.uniform(8, 15))
        speed = rng.uniform(20, 45)
        u = u + speed * torch.exp(-((lat - sign * phi) / width) ** 2)
    vd = s.vrtdivspec(torch.stack((u, torch.zeros_like(u))))
    nl, nm = s.lmax, s.mmax
    ell = torch.arange(nl, dtype=torch.float64).reshape(-1, 1)
    amp = torch.exp(-(((ell - 5.0) / 3.0) ** 2)).expand(nl, nm)
    re, im = torch.as_tensor(rng.standard_normal((nl, nm))), torch.as_tensor(rng.standard_normal((nl, nm)))
    im[:, 0] = 0.0
    psi = torch.tril(amp * torch.complex(re, im))
    psi[0, 0] = 0.0
    eddy = s.lap * psi
    uv_eddy = s.getuv(torch.stack((eddy, torch.zeros_like(eddy))))
    vd[0] = vd[0] + eddy * (rng.uniform(8, 15) / torch.sqrt((uv_eddy**2).sum(0).mean()))
    uv = s.getuv(vd)
    flux = s.vrtdivspec(uv * (s.spec2grid(vd[0]) + s.coriolis))
    bumps = torch.zeros(nlat, nlon, dtype=torch.float64)
    for _ in range(3):
        la, lo, a = math.radians(rng.uniform(-60, 60)), rng.uniform(0, 2 * math.pi), rng.uniform(-150, 150)
        cosd = torch.sin(lat) * math.sin(la) + torch.cos(lat) * math.cos(la) * torch.cos(lon - lo)
        bumps = bumps + a * torch.exp(-((torch.arccos(cosd.clamp(-1, 1)) / 0.2) ** 2))
    phi = s.invlap * flux[0] - s.grid2spec(0.5 * (uv**2).sum(0)) + s.grid2spec(s.gravity * (s.havg + bumps))
    state = torch.zeros(3, nl, nm, dtype=vd.dtype)
    state[0], state[1:] = phi, vd
    return torch.tril(state)


def _dudt(s, u):
    """`ShallowWaterSolver.dudtspec` for a batch of states (B, 3, L, M): same operators, same terms."""
    import torch

    grid = s.spec2grid(u)
    uv = s.getuv(u[:, 1:])
    out = torch.zeros_like(u)
    tmp = s.vrtdivspec(uv * (grid[:, 1:2] + s.coriolis))
    out[:, 2] = tmp[:, 0]
    out[:, 1] = -1 * tmp[:, 1]
    tmp = s.vrtdivspec(uv * grid[:, 0:1])
    out[:, 0] = -1 * tmp[:, 1]
    out[:, 2] = out[:, 2] - s.lap * s.grid2spec(grid[:, 0] + 0.5 * (uv[:, 0] ** 2 + uv[:, 1] ** 2))
    return out


def batched_timestep(s, u, nsteps: int):
    """`ShallowWaterSolver.timestep` (Adams-Bashforth 3 started by Euler/AB2 on every call, implicit
    hyperdiffusion) for a batch of independent states (B, 3, L, M): one call integrates every trajectory."""
    hist = [u, u, u]
    inew, inow, iold = 0, 1, 2
    for it in range(nsteps):
        hist[inew] = _dudt(s, u)
        if it == 0:
            hist[inow] = hist[inew]
            hist[iold] = hist[inew]
        elif it == 1:
            hist[iold] = hist[inew]
        u = u + s.dt * ((23.0 / 12.0) * hist[inew] - (16.0 / 12.0) * hist[inow] + (5.0 / 12.0) * hist[iold])
        u[:, 1:] = s.hyperdiff * u[:, 1:]
        inew, inow, iold = (inew - 1) % 3, (inow - 1) % 3, (iold - 1) % 3
    return u


def _fields(s, state) -> np.ndarray:
    """(B, 4, nlat, nlon) geopotential, u, v, vorticity on the solver grid (north to south)."""
    import torch

    grid = s.spec2grid(state)
    uv = s.getuv(state[:, 1:])
    return torch.stack((grid[:, 0], uv[:, 0], uv[:, 1], grid[:, 1]), dim=1).numpy()


def generate_sample(grid: tuple[int, int] = DEFAULT_GRID, days: int = DEFAULT_DAYS, seed: int = 0,
                    trajectories: int = DEFAULT_TRAJECTORIES, spinup_days: int = 5,
                    progress: bool | None = None) -> xr.Dataset:
    """The sample as an in-memory Dataset (no stats); `days` are kept per trajectory."""
    import torch

    nlat, nlon = grid
    steps = 4 * days
    with _one_thread(), torch.no_grad():
        s, n_sub = _solver(nlat, nlon)
        out = np.empty((len(VARIABLES), trajectories * steps, nlat, nlon), dtype=np.float32)
        # all trajectories are integrated together as one batch (independent states)
        rngs = [np.random.default_rng([seed, k]) for k in range(trajectories)]
        state = torch.stack([_initial_state(s, rng) for rng in rngs])
        with tqdm(total=steps + 4 * spinup_days, desc="shallow water", unit="6h",
                  disable=None if progress is None else not progress) as bar:
            for i in range(-4 * spinup_days, steps):
                state = batched_timestep(s, state, n_sub)
                if not bool(torch.isfinite(state).all()):  # stop at once, not after the whole run
                    raise DataError(f"shallow-water sample: the integration became unstable (non-finite values "
                                    f"at day {(i + 4 * spinup_days + 1) / 4:g} of grid {nlat}x{nlon}, seed {seed})")
                if i >= 0:
                    out[:, i::steps] = _fields(s, state).transpose(1, 0, 2, 3)
                bar.update()
        if not np.all(np.isfinite(out)):  # finite float64 states can still overflow float32
            raise DataError(f"shallow-water sample: values beyond float32 in grid {nlat}x{nlon}, seed {seed}")
        lat = np.degrees(s.lats.numpy())
        lon = np.degrees(s.lons.numpy())
    order = np.argsort(lat)  # solver grid runs north -> south; the store's latitude ascends
    out = out[:, :, order]
    times = pd.date_range(START, periods=trajectories * steps, freq="6h").values
    units = {"geopotential": "m**2 s**-2", "u_component_of_wind": "m s**-1", "v_component_of_wind": "m s**-1",
             "vorticity": "s**-1"}
    data = {v: ((TIME, LAT, LON), out[i], {"units": units[v]}) for i, v in enumerate(VARIABLES)}
    coords = {TIME: times, LAT: lat[order].astype(np.float64), LON: np.mod(lon, 360.0).astype(np.float64),
              TRAJECTORY: (TIME, np.repeat(np.arange(trajectories, dtype=np.int64), steps))}
    attrs = {"source": SOURCE, "conventions": "wxray store v1 (WeatherBench 2 names, latitude ascending)",
             "wxray_version": wxray.__version__, "sample_grid": f"{nlat}x{nlon}", "sample_days": days,
             "sample_seed": seed, "sample_trajectories": trajectories, "sample_spinup_days": spinup_days,
             "solver": f"ShallowWaterSolver equiangular lmax={s.lmax} dt={STEP_S / n_sub:.0f}s float64",
             "n_missing": 0}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def make_sample_store(path: str | Path, grid: tuple[int, int] = DEFAULT_GRID, days: int = DEFAULT_DAYS,
                      seed: int = 0, trajectories: int = DEFAULT_TRAJECTORIES, spinup_days: int = 5,
                      clim_window_days: int = 15, overwrite: bool = False,
                      progress: bool | None = None) -> SampleResult:
    """Generate the sample and write it, with its stats, as a store at `path` (atomically)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise DataError(f"out {path} already exists (set overwrite=true to replace it)")
    t0 = time.perf_counter()
    ds = generate_sample(grid, days, seed, trajectories, spinup_days, progress=progress)
    seconds = time.perf_counter() - t0
    with atomic_path(path) as tmp:
        writer = StoreWriter(tmp)
        writer.write(ds)
        add_stats(tmp, clim_window_days=clim_window_days, progress=progress)
        writer.finish({**ds.attrs, "generate_seconds": round(seconds, 2)})
    return SampleResult(path, ds.sizes[TIME], grid, trajectories, seconds)


def ensure_sample_store(path: str | Path, grid: tuple[int, int] = DEFAULT_GRID, days: int = DEFAULT_DAYS,
                        seed: int = 0, trajectories: int = DEFAULT_TRAJECTORIES) -> Path:
    """`path` if it already holds a readable store with stats, else generate the sample there.

    An existing store is returned as is (whatever its parameters); one that is unreadable raises
    DataError rather than being overwritten. Concurrent callers (e.g. Ray workers) serialise on a lock
    file beside the store, so the sample is generated once.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.exists():
                open_store(path)
                open_stats(path)
                return path
            make_sample_store(path, grid=grid, days=days, seed=seed, trajectories=trajectories)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path
