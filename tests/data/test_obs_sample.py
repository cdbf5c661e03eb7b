"""The synthetic observation streams: what make_sample_obs promises (kinds, counts, uneven density, values =
truth + the documented noise, moving swaths on their own grid), determinism, atomic writes, the job."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.dataset as pads
import pytest
import xarray as xr

from tests.data.data_helpers import JobRun
from tests.data.obs_helpers import listing, write_level_store
from wxray.data.obs import open_registry
from wxray.data.obs.sample import NOISE, make_sample_obs, representativeness
from wxray.data.obs.synth import CONTINENTS, box_area, in_boxes
from wxray.data.schema import open_stats, open_store
from wxray.errors import DataError

NAMES = ["stations", "ships", "profiles", "swath_tb", "swath_wind"]


def points(obs_dir, name) -> pd.DataFrame:
    return pads.dataset(obs_dir / "points" / f"stream={name}", format="parquet", partitioning="hive").to_table() \
        .to_pandas()


def truth_at(store, var, times, lat, lon, level=None) -> np.ndarray:
    """Bilinear truth by xarray (independent of the generator): longitude padded with its wrap column."""
    da = open_store(store)[var]
    da = (da if level is None else da.sel(level=level)).load()
    da = xr.concat([da, da.isel(longitude=[0]).assign_coords(longitude=[360.0])], "longitude")
    p = "points"
    return da.interp(time=xr.DataArray(times, dims=p), latitude=xr.DataArray(lat, dims=p),
                     longitude=xr.DataArray(lon, dims=p)).values


def test_streams_kinds_counts_and_registry(small_obs, small_store):
    reg = open_registry(small_obs.obs_dir)
    assert reg.names == NAMES and reg.source_store == str(small_store)
    assert [reg.streams[n].kind for n in NAMES] == ["point"] * 3 + ["gridded"] * 2
    n_times = open_store(small_store).sizes["time"]
    st = points(small_obs.obs_dir, "stations")
    assert st.station.nunique() == 300 and abs(len(st) / (300 * n_times) - 0.9) < 0.03  # ~10% reports missing
    assert {"obs_id", "time", "station", "latitude", "longitude", "altitude", "quality"} <= set(st.columns)
    assert st.obs_id.is_unique and st.longitude.between(0, 360, inclusive="left").all()
    assert 0.015 < (st.quality == 1).mean() < 0.05 and 0 < (st.quality == 2).mean() < 0.02
    assert points(small_obs.obs_dir, "ships").station.nunique() == 60
    pr = points(small_obs.obs_dir, "profiles")
    steps = open_store(small_store).time.values
    assert pr.station.nunique() == 40 and set(pr.time.unique()) <= set(steps[::2]) and "level" not in pr
    assert 0.05 < pr[reg.streams["profiles"].variables].isna().mean().mean() < 0.15
    for n in ("stations", "ships", "profiles"):
        s = reg.streams[n]
        assert s.variables == ["geopotential", "u_component_of_wind", "v_component_of_wind"] and s.description
        factor = {"stations": 1.0, "ships": 1.5, "profiles": 0.7}[n]
        assert s.noise == {v: pytest.approx(factor * NOISE[v]) for v in s.variables}
        df = points(small_obs.obs_dir, n)
        per_step = np.bincount(np.searchsorted(steps, df.time.to_numpy())).max()  # reports per (t - step, t]
        assert per_step <= s.max_per_step <= 2 * per_step
    assert reg.streams["swath_tb"].noise == {"brightness_temperature": 1.0}
    assert reg.streams["swath_wind"].noise == {"wind_speed": 2.0}
    assert small_obs.figures()["streams"]["stations"]["n_obs"] == len(st)


def test_station_density_is_uneven(small_obs):
    st = points(small_obs.obs_dir, "stations").drop_duplicates("station")
    inside = in_boxes(st.latitude.to_numpy(), st.longitude.to_numpy())
    area_in = sum(box_area(b) for b in CONTINENTS)
    dense = inside.sum() / area_in
    sparse = (~inside).sum() / (4 * np.pi - area_in)
    assert 0.7 < inside.mean() < 0.8 and dense > 15 * sparse
    alt = st.altitude.to_numpy()
    assert np.nanmean(alt[inside]) > 2 * np.nanmean(alt[~inside]) and np.nanmin(alt) >= 0


def test_point_values_are_truth_plus_the_documented_noise(small_obs, small_store):
    reg = open_registry(small_obs.obs_dir)
    st = points(small_obs.obs_dir, "stations")
    land = in_boxes(st.latitude.to_numpy(), st.longitude.to_numpy())
    for v in reg.streams["stations"].variables:
        # what a station measures of the grid state (representativeness), then the documented noise
        seen = representativeness(v, truth_at(small_store, v, st.time.to_numpy(), st.latitude.to_numpy(),
                                              st.longitude.to_numpy()), land, st.altitude.to_numpy())
        res = st[v].to_numpy() - seen
        good = (st.quality == 0).to_numpy() & np.isfinite(res)
        noise = reg.streams["stations"].noise[v]
        assert abs(res[good].std() / noise - 1) < 0.1 and abs(res[good].mean()) < 0.1 * noise, v
    z = "geopotential"
    res = st[z].to_numpy() - representativeness(z, truth_at(small_store, z, st.time.to_numpy(),
                                                            st.latitude.to_numpy(), st.longitude.to_numpy()),
                                                land, st.altitude.to_numpy())
    assert np.nanmedian(np.abs(res[(st.quality == 2).to_numpy()])) > 50 * reg.streams["stations"].noise[z]
    # ships: times jittered inside the step, truth linear in time within a trajectory, far from the boxes
    sh = points(small_obs.obs_dir, "ships")
    times = open_store(small_store).time.values
    assert not np.isin(sh.time.to_numpy(), times).all() and not in_boxes(sh.latitude, sh.longitude).any()
    k = np.searchsorted(times, sh.time.to_numpy())
    inner = (k > 0) & (k != len(times) // 2) & (k < len(times))  # the first step of either trajectory has no past
    sh = sh[inner]
    res = sh[z].to_numpy() - truth_at(small_store, z, sh.time.to_numpy(), sh.latitude.to_numpy(),
                                      sh.longitude.to_numpy())
    good = (sh.quality == 0).to_numpy() & np.isfinite(res)
    assert abs(res[good].std() / reg.streams["ships"].noise[z] - 1) < 0.15


def test_swaths_on_their_own_grid_nonlinear_and_moving(small_obs, small_store):
    store = open_store(small_store)
    tb = xr.open_zarr(small_obs.obs_dir / "swath_tb.zarr")["obs"]
    wind = xr.open_zarr(small_obs.obs_dir / "swath_wind.zarr")["obs"]
    assert tb.dims == ("time", "channel", "latitude", "longitude") and tb.shape == (store.sizes["time"], 1, 24, 48)
    assert tb.channel.values.tolist() == ["brightness_temperature"] and wind.channel.values.tolist() == ["wind_speed"]
    assert not np.isin(tb.latitude.values, store.latitude.values).any()  # not the model grid
    seen_tb, seen_wind = np.isfinite(tb.values), np.isfinite(wind.values)
    assert 0.25 < seen_tb.mean() < 0.5 and seen_wind.mean() > seen_tb.mean() + 0.1
    assert all((seen_tb[i] != seen_tb[i + 1]).mean() > 0.2 for i in range(5))  # the swaths advance each step
    la, lo = np.meshgrid(tb.latitude.values, tb.longitude.values, indexing="ij")
    t = np.repeat(store.time.values, la.size)
    args = (t, np.tile(la.ravel(), len(store.time)), np.tile(lo.ravel(), len(store.time)))
    shape = tb.shape[:1] + tb.shape[2:]
    stats = open_stats(small_store)
    zn = (truth_at(small_store, "geopotential", *args).reshape(shape) - float(stats.mean["geopotential"])) \
        / float(stats.std["geopotential"])
    zeta = truth_at(small_store, "vorticity", *args).reshape(shape)
    expected = 250 + 25 * np.tanh(zn) - 6 * np.minimum((zeta / float(stats.std["vorticity"])) ** 2, 9)
    res = tb.values[:, 0] - expected
    assert abs(np.nanstd(res) - 1.0) < 0.1 and abs(np.nanmean(res)) < 0.1
    speed = np.hypot(truth_at(small_store, "u_component_of_wind", *args),
                     truth_at(small_store, "v_component_of_wind", *args)).reshape(shape)
    res = wind.values[:, 0] - speed
    fast = speed > 6  # clipping at 0 does not bite
    assert abs(np.nanstd(res[fast]) - 2.0) < 0.2


def test_same_seed_same_files(small_obs, small_store, tmp_path):
    again = make_sample_obs(small_store, tmp_path / "a", seed=0)
    assert listing(again.obs_dir) == listing(small_obs.obs_dir)
    other = make_sample_obs(small_store, tmp_path / "b", seed=1)
    a, b = listing(again.obs_dir), listing(other.obs_dir)
    assert a.keys() == b.keys() and a["obs.yaml"] != b["obs.yaml"]
    ships = "points/stream=ships/day=2000-01-01/part-0.parquet"
    assert a[ships] != b[ships]


def test_profiles_on_a_store_with_levels(tmp_path):
    store = tmp_path / "levels.zarr"
    write_level_store(store)
    res = make_sample_obs(store, tmp_path / "obs", stations=30, ships=5, profiles=6)
    reg = open_registry(res.obs_dir)
    pr = reg.streams["profiles"]
    assert pr.levels == [850, 500, 250]
    assert pr.variables == ["geopotential", "temperature", "u_component_of_wind", "v_component_of_wind"]
    assert pr.channels[:3] == ["geopotential_850", "geopotential_500", "geopotential_250"]
    df = points(res.obs_dir, "profiles")
    assert df.level.dtype == np.int32 and set(df.level) == {850, 500, 250}
    assert pr.max_per_step == df.groupby("time").station.nunique().max()
    # surface streams of a store without surface fields observe the lowest level (1000 hPa)
    st = points(res.obs_dir, "stations")
    st = st[st.quality == 0]
    land = in_boxes(st.latitude.to_numpy(), st.longitude.to_numpy())
    res = {lv: st.geopotential.to_numpy() - representativeness(
        "geopotential", truth_at(store, "geopotential", st.time.to_numpy(), st.latitude.to_numpy(),
                                 st.longitude.to_numpy(), level=lv), land, st.altitude.to_numpy())
           for lv in (1000, 850)}
    assert np.nanstd(res[1000]) < 0.2 * np.nanstd(res[850])


def test_existing_out_is_refused_and_nothing_half_written(small_store, small_obs, tmp_path):
    before = listing(small_obs.obs_dir)
    with pytest.raises(DataError, match="already exists .*overwrite=true"):
        make_sample_obs(small_store, small_obs.obs_dir)
    assert listing(small_obs.obs_dir) == before
    with pytest.raises(DataError, match="does not exist"):
        make_sample_obs(tmp_path / "no.zarr", tmp_path / "obs")
    assert not list(tmp_path.iterdir())
    (tmp_path / "empty").mkdir()
    assert make_sample_obs(small_store, tmp_path / "empty", stations=5, ships=0, profiles=0).obs_dir.exists()
    assert open_registry(tmp_path / "empty").names == ["stations", "swath_tb", "swath_wind"]


def test_make_sample_obs_job(small_store, tmp_path, capsys):
    from wxray.job import run_job
    from wxray.prepare.obs import SampleObsConfig, make_sample_obs_main

    rc = run_job("make_sample_obs", SampleObsConfig, make_sample_obs_main,
                 [f"store={small_store}", f"out={tmp_path / 'obs'}", "stations=50", "ships=4", "profiles=3",
                  "swath_grid=12x24", f"out_dir={tmp_path / 'run'}", "tracking.enabled=false"])
    cap = capsys.readouterr()
    run = JobRun(rc, cap.out, cap.err)
    assert rc == 0, cap.err
    r = run.result
    assert r["obs_dir"] == str(tmp_path / "obs") and set(r["streams"]) == set(NAMES)
    assert r["streams"]["stations"]["n_sites"] == 50 and r["streams"]["swath_tb"]["kind"] == "gridded"
    assert r["n_obs"] == sum(s["n_obs"] for s in r["streams"].values())
    assert open_registry(tmp_path / "obs").streams["swath_tb"].latitude.size == 12
    assert not list(tmp_path.glob(".obs.tmp-*"))


def test_a_swath_grid_that_cannot_fit_is_refused_before_any_work(small_store, tmp_path, capsys):
    from wxray.job import run_job
    from wxray.prepare.obs import SampleObsConfig, make_sample_obs_main

    rc = run_job("make_sample_obs", SampleObsConfig, make_sample_obs_main,
                 [f"store={small_store}", f"out={tmp_path / 'obs'}", "swath_grid=100000x200000",
                  f"out_dir={tmp_path / 'run'}", "tracking.enabled=false"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: swath_grid=100000x200000 over the store's") and "lower swath_grid" in err
    assert not list(tmp_path.iterdir())
