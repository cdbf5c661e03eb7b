"""The streamed scorecard (verify.blocks, verify.streaming): any split into blocks of inits, latitude bands, any
number of worker processes or a custom block map gives the scorecard of one block of all inits (the in-memory
path), and its maps and rank histogram are those of the in-memory functions (`scores`' rank histogram)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from tests.verify.conftest import make_store, nested_forecast, persistence_file, run_evaluate
from wxray.data.schema import INIT, LAT, LEAD, channels, open_climatology, open_store, select_channel
from wxray.errors import ConfigError
from wxray.verify import ensemble as ens
from wxray.verify import streaming
from wxray.verify.blocks import MIB, ProcessMap, bands, block_map, ordered_ahead, plan_blocks
from wxray.verify.forecasts import persistence_forecast, truth_at
from wxray.verify.scorecard import Model, build_scorecard
from wxray.verify.spatial import spatial_weights

N_INIT = 7
ALL = 10**6  # MiB: one block of every init, whole grid


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    store = make_store(tmp_path_factory.mktemp("stream") / "store.zarr")
    ds, clim = open_store(store), open_climatology(store)
    inits = ds.time.values[:N_INIT]
    pers = persistence_forecast(ds, inits, [6, 24], ["geopotential", "2m_temperature"])
    rng = np.random.default_rng(3)
    noise = {"geopotential": 40.0, "2m_temperature": 0.4}
    noisy = (pers + xr.Dataset({v: (pers[v].dims, rng.normal(0, s, pers[v].shape)) for v, s in noise.items()},
                               coords=pers.coords)).load()
    nested = nested_forecast(ds, inits, [6, 24], m=3, n=2).load()
    flat = ens.flatten_members(nested["2m_temperature"]).to_dataset(name="2m_temperature")
    flat["geopotential"] = ens.flatten_members(nested["geopotential"])
    flat = flat.transpose(INIT, LEAD, "member", ...)
    holes = flat.copy(deep=True)
    holes["2m_temperature"][2, 1, 3, 4, 5] = np.nan  # one member at one point: skipped there with skipna
    holes["2m_temperature"][5, 0, :, :, 7] = np.nan  # a whole meridian of one init
    chans = channels(pers, ["geopotential", "2m_temperature"], [500])
    cases = {
        "deterministic": dict(forecast=Model("f", noisy), baseline=Model("persistence", pers), climatology=clim,
                              method="paper", n_bootstrap=200),
        "ensemble": dict(forecast=Model("e", flat), baseline=Model("persistence", pers), climatology=clim),
        "nested": dict(forecast=Model("n", nested), baseline=Model("e", flat)),
        "skipna_region": dict(forecast=Model("h", holes), baseline=Model("persistence", pers), skipna=True,
                              region="tropics", climatology=clim),
    }
    return ds, chans, cases


def card(inputs, case: str, chans=None, **kw) -> xr.Dataset:
    ds, all_chans, cases = inputs
    return build_scorecard(truth=ds, channels=chans or all_chans, **cases[case], **kw)


@pytest.fixture(scope="module")
def reference(inputs):
    """Every case scored as one block of all inits on the whole grid: the in-memory path."""
    return {case: card(inputs, case, init_block=N_INIT, block_mib=ALL) for case in inputs[2]}


def assert_same(a: xr.Dataset, b: xr.Dataset, rtol: float = 1e-12, banded: bool = False) -> None:
    assert set(a.data_vars) == set(b.data_vars) and a.attrs == b.attrs
    for v in a.data_vars:
        x, y = a[v].values, b[v].values
        if x.dtype.kind != "f":
            np.testing.assert_array_equal(x, y, err_msg=v)
            continue
        # bands add the spatial sums in another order: rounding, which a relative difference of nearly equal
        # scores (rel_diff's interval, a DM statistic near 0) turns into relative noise of ~1e-12 of the
        # variable's scale (the fixtures: at most 9e-12); init blocks only change the maps' sums (~1e-15)
        atol = 1e-11 * np.nanmax(np.abs(y), initial=0.0) if banded else 0.0
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, equal_nan=True, err_msg=v)


@pytest.mark.parametrize("case", ["deterministic", "ensemble", "nested", "skipna_region"])
@pytest.mark.parametrize("init_block", [1, 3, N_INIT])
def test_blocks_of_inits_give_the_scorecard_of_all_inits(inputs, reference, case, init_block):
    assert_same(card(inputs, case, init_block=init_block, block_mib=ALL), reference[case])


# bands of 6, 6 and 4 rows of one init: 6 rows x 32 points x (K + 1 [+ 1 climatology]) values x 8 bytes
BANDS_MIB = {case: 6 * 32 * values * 8 / MIB for case, values in
             (("deterministic", 3), ("ensemble", 8), ("nested", 7), ("skipna_region", 8))}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["deterministic", "ensemble", "nested", "skipna_region"])
def test_latitude_bands_give_the_scorecard_of_the_whole_grid(inputs, case, monkeypatch):
    """On one channel (2m_temperature, where the holes are): a band's cost is per init and channel, and the
    channels are scored alike (init blocks: both)."""
    one = inputs[1][-1:]
    whole = card(inputs, case, one, init_block=N_INIT, block_mib=ALL)
    starts = set()
    score_band = streaming._score_band

    def spy(task, rows, band, acc):
        starts.add(rows.start)
        return score_band(task, rows, band, acc)

    monkeypatch.setattr(streaming, "_score_band", spy)
    banded = card(inputs, case, one, block_mib=BANDS_MIB[case])
    assert starts == {0, 6, 12}
    assert_same(banded, whole, banded=True)


@pytest.mark.parametrize("case", ["deterministic", "nested"])
def test_worker_processes_give_the_same_scorecard_to_the_bit(inputs, case):
    one = card(inputs, case, init_block=3, block_mib=ALL)
    two = card(inputs, case, init_block=3, block_mib=ALL, workers=2)
    xr.testing.assert_identical(one, two)


def test_a_custom_block_map_scores_every_block_in_order(inputs, reference):
    calls = []

    def recording_map(fn, tasks):  # what a Ray layer would do: fan out, return in order
        for task in tasks:
            calls.append(task.truth[INIT].values)
            yield fn(task)

    got = card(inputs, "ensemble", init_block=4, block_mib=ALL, map_blocks=recording_map)
    assert_same(got, reference["ensemble"])
    ds, chans, cases = inputs
    per_lead = [len(c) for c in calls[:2]]
    assert per_lead == [4, 3] and len(calls) == len(chans) * 2 * 2
    assert isinstance(block_map(2), ProcessMap) and block_map(1) is map


@pytest.mark.slow
def test_ordered_ahead_keeps_the_order_bounds_what_is_in_flight_and_cancels_the_rest():
    """The shape of both block maps (worker processes, Ray tasks): work submitted ahead, results in order."""
    submitted, done, cancelled = [], [], []

    def submit(x, y):
        submitted.append(x)
        return x, y

    def result(work):
        done.append(work[0])
        assert len(submitted) - len(done) <= 2  # the awaited one and at most `ahead` = 2 beyond it
        return work[0] * work[1]

    assert list(ordered_ahead(submit, result, [range(7), range(10, 17)], 2)) == [x * (x + 10) for x in range(7)]
    submitted.clear(), done.clear()
    it = ordered_ahead(submit, result, [range(7), range(7)], 2, cancel=lambda w: cancelled.append(w[0]))
    assert [next(it), next(it)] == [0, 1]
    it.close()  # abandoned: what was submitted and not awaited is dropped
    assert cancelled == [2, 3]


def test_maps_and_rank_histogram_equal_the_in_memory_functions(inputs):
    """The streamed time-mean maps and rank histogram (block sums, band rows, one sort) against the whole-lead
    fields: the CRPS and variance fields' init means, and `scores`' rank histogram (`ensemble.rank_histogram`)."""
    ds, chans, cases = inputs
    for case, member_dims in (("ensemble", ("member",)), ("nested", ("encoder_draw", "dropout_draw"))):
        forecast = cases[case]["forecast"].data
        for kw in ({"init_block": 3, "block_mib": ALL}, {"block_mib": BANDS_MIB[case]}):
            got = card(inputs, case, chans[-1:], intervals=False, **kw)
            for ch in chans[-1:]:
                for lead in forecast[LEAD].values[-1:]:
                    f = select_channel(forecast, ch).sel({LEAD: lead}).astype(np.float64)
                    t = truth_at(select_channel(ds, ch), forecast[INIT].values, lead, "t").astype(np.float64)
                    at = dict(channel=ch.name, lead_time=lead)
                    flat = ens.flatten_members(f, member_dims) if len(member_dims) > 1 else f
                    with np.errstate(all="ignore"):
                        hist = ens.rank_histogram(flat, t, "member").values
                    np.testing.assert_allclose(got["rank_histogram"].sel(at).values, hist, rtol=1e-12)
                    crps = (ens.crps_field_nested(f, t) if len(member_dims) > 1 else ens.crps_field(f, t)).mean(INIT)
                    np.testing.assert_allclose(got["crps_map"].sel(at).values, crps.transpose(LAT, ...).values,
                                               rtol=1e-12)
                    var = ens.ensemble_variance(flat, "member") if len(member_dims) == 1 else None
                    if var is not None:
                        np.testing.assert_allclose(got["spread_map"].sel(at).values,
                                                   np.sqrt(var.mean(INIT)).transpose(LAT, ...).values, rtol=1e-12)


def test_rank_counts_are_scores_rank_histogram_with_ties_missing_values_and_a_region():
    rng = np.random.default_rng(0)
    lat, lon = np.linspace(-80, 80, 6), np.arange(8) * 45.0
    coords = {"latitude": lat, "longitude": lon}
    for k in (2, 5, 40):
        x = rng.integers(0, 4, (3, k, 6, 8)).astype(float)  # many ties
        y = rng.integers(0, 4, (3, 6, 8)).astype(float)
        x[0, 1, 2, 3], y[1, 2, 2] = np.nan, np.nan
        fc = xr.DataArray(x, dims=(INIT, "member", LAT, "longitude"), coords=coords)
        truth = xr.DataArray(y, dims=(INIT, LAT, "longitude"), coords=coords)
        for region in (None, "tropics"):
            with np.errstate(all="ignore"), pytest.warns(UserWarning):
                expected = ens.rank_histogram(fc, truth, "member", region=region).values
            counts = ens.rank_counts(ens.sort_members(fc, "member"), truth,
                                     spatial_weights(truth[LAT], truth["longitude"], region))
            np.testing.assert_allclose(counts / counts.sum(), expected, rtol=1e-12, atol=1e-15)


def test_one_sort_per_block_serves_both_crps_and_the_rank_histogram(inputs, monkeypatch):
    sorts = []
    monkeypatch.setattr(ens, "sort_members", lambda x, dim, f=ens.sort_members: sorts.append(dim) or f(x, dim))
    card(inputs, "ensemble", init_block=5, block_mib=ALL)
    ds, chans, cases = inputs
    assert len(sorts) == len(chans) * 2 * 2  # channels x leads x blocks; the baseline has no members


def test_no_block_loads_more_than_its_budget(inputs, monkeypatch):
    loaded = []
    load = streaming._load
    monkeypatch.setattr(streaming, "_load", lambda da: loaded.append(load(da)) or loaded[-1])
    budget = 0.1  # MiB: 3 inits of K + 2 = 8 values per point on 16 x 32 points (96 KiB) fit, 4 do not
    card(inputs, "ensemble", block_mib=budget)
    sizes = {a.sizes[INIT] for a in loaded}
    assert max(a.nbytes for a in loaded) <= budget * MIB and sizes == {3, 1}  # 7 inits: 3 + 3 + 1


@pytest.mark.slow
def test_the_job_takes_its_block_keys(store_path, tmp_path, capsys):
    """jobs/evaluate.py with init_block, block_mib and workers: the scorecard and RESULT of the default run."""
    forecast = persistence_file(store_path, tmp_path, n_init=5, leads=(6, 24))
    runs = {}
    for name, keys in (("default", []), ("blocks", ["init_block=3", "workers=2"]), ("bands", ["block_mib=0.005"])):
        out = tmp_path / name
        rc, result, err = run_evaluate([f"forecast={forecast}", f"truth={store_path}", "baseline=persistence",
                                        f"out_dir={out}", "tracking.enabled=false", "plots=false", *keys], capsys)
        assert rc == 0, err
        runs[name] = result, xr.load_dataset(out / "scorecard.nc")
    for name in ("blocks", "bands"):
        assert_same(runs[name][1], runs["default"][1], banded=name == "bands")
        assert runs[name][0].keys() == runs["default"][0].keys()


def test_plan_blocks():
    row = 8 * 10 * 32  # bytes of one latitude row of 10 values per point
    assert plan_blocks(100, 16, 32, 10, block_bytes=5 * 16 * row) == plan_blocks(100, 16, 32, 10, 5, 5 * 16 * row)
    plan = plan_blocks(100, 16, 32, 10, block_bytes=5 * 16 * row + 1)
    assert (plan.init_block, plan.rows, plan.banded) == (5, 16, False)
    assert plan.init_slices(12) == [slice(0, 5), slice(5, 10), slice(10, 12)]
    plan = plan_blocks(100, 16, 32, 10, block_bytes=6 * row)  # one init is 16 rows: bands of 6
    assert (plan.init_block, plan.rows, plan.banded) == (1, 6, True)
    assert bands(16, 6) == [slice(0, 6), slice(6, 12), slice(12, 16)]
    assert plan_blocks(3, 16, 32, 10, block_bytes=10**9).init_block == 3  # never more than the inits
    assert plan_blocks(100, 16, 32, 10, init_block=4, block_bytes=32 * row).rows == 8  # 4 inits of 8 rows
    with pytest.raises(ConfigError, match="init_block"):
        plan_blocks(10, 16, 32, 10, init_block=-1)
    with pytest.raises(ConfigError, match="workers"):
        block_map(0)
