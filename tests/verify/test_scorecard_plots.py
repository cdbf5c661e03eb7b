"""Scorecard figures a researcher can read (issue 15), checked on the Figure objects evaluate saves: units on
every axis and colour bar, ticks at the lead hours, the baseline named in legends, stable panel order, a
zero line on bias plots, the WeatherBench-2-style heatmap; and the RESULT keys of a comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from matplotlib.colors import to_rgba

import wxray.verify.plots as plots
from tests.verify.conftest import make_store, nested_forecast, write_zarr
from wxray.data.schema import channels, open_store
from wxray.job import run_job
from wxray.verify.evaluate import EvaluateConfig, evaluate
from wxray.verify.forecasts import persistence_forecast
from wxray.verify.scorecard import REL_DIFF_CONVENTION, Model, build_scorecard

LEADS = [6, 12, 18, 24]
UNITS = {"2m_temperature": "K", "geopotential_500": "m**2 s**-2", "geopotential_850": "m**2 s**-2"}
PRETTY = {"2m_temperature": "K", "geopotential_500": "m² s⁻²", "geopotential_850": "m² s⁻²"}  # as labels show them


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """A nested ensemble against persistence through the job; the figures write_plots saved, by file name."""
    tmp = tmp_path_factory.mktemp("plots")
    store = make_store(tmp / "store.zarr")
    ds = open_store(store)
    forecast = write_zarr(nested_forecast(ds, ds.time.values[:16], LEADS, m=3, n=4), tmp / "nested.zarr")
    saved: dict[str, object] = {}
    original = plots.figures

    def spy(card):
        for name, fig in original(card):
            saved[name] = fig
            yield name, fig

    out_dir = tmp / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "figures", spy)
        rc = run_job("evaluate", EvaluateConfig, evaluate,
                     argv=[f"forecast={forecast}", f"truth={store}", "baseline=persistence", f"out_dir={out_dir}",
                           "tracking.enabled=false", "n_bootstrap=300"])
    assert rc == 0
    card = xr.open_dataset(out_dir / "scorecard.nc").load()
    result = json.loads((out_dir / "summary.json").read_text())
    return card, result, saved, out_dir


def _visible(fig):
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


@pytest.mark.slow
def test_every_figure_is_saved_and_inspectable(compared):
    card, _, saved, out_dir = compared
    files = sorted(p.name for p in (out_dir / "plots").iterdir())
    assert files == sorted(saved)
    assert {"scorecard_rmse.png", "scorecard_crps.png", "score_bias.png", "spread_skill.png"} <= set(files)


def test_line_plots_carry_units_lead_hour_ticks_and_the_baseline_name(compared):
    card, _, saved, _ = compared
    out_dir_name = Path(card.attrs["forecast"].removeprefix("forecast ")).parent.name  # tells runs apart
    order = list(card["channel"].values)
    assert order == sorted(order)  # no variables= given: sorted, the same on every run
    for metric, name in (("rmse", "RMSE"), ("crps", "CRPS"), ("mae", "MAE"), ("spread", "ensemble spread")):
        axes = _visible(saved[f"score_{metric}.png"])
        assert [ax.get_title() for ax in axes] == order
        for ax, ch in zip(axes, order):
            assert ax.get_ylabel() == f"{name} [{PRETTY[ch]}]"
            assert ax.get_xlabel() == "lead time [h]"
            np.testing.assert_array_equal(ax.get_xticks(), LEADS)
            assert [t.get_text() for t in ax.get_xticklabels()] == ["6", "12", "18", "24"]
            if metric in ("rmse", "crps", "mae"):  # compared with the baseline
                labels = [t.get_text() for t in ax.get_legend().get_texts()]
                assert labels[:2] == ["baseline: persistence", f"forecast: {out_dir_name}/nested.zarr"]
                assert "significant (Diebold-Mariano, p < 0.05)" in labels
    for metric in ("acc", "ssim", "rho_drop"):  # dimensionless: no units
        assert "[" not in _visible(saved[f"score_{metric}.png"])[0].get_ylabel()
    ssr = _visible(saved["spread_skill.png"])[0]
    assert ssr.get_ylabel() == "spread-skill ratio" and list(ssr.get_xticks()) == LEADS


def test_bias_plots_have_a_zero_line(compared):
    _, _, saved, _ = compared
    for ax in _visible(saved["score_bias.png"]):
        assert ax.get_ylabel().startswith("bias (forecast - truth) [")
        zero = [ln for ln in ax.get_lines() if np.all(np.asarray(ln.get_ydata()) == 0)
                and list(ln.get_xdata()) == [0, 1]]  # axhline: axes coordinates in x
        assert len(zero) == 1


def test_heatmap_is_the_relative_difference_with_significance_dots(compared):
    card, _, saved, _ = compared
    for metric, name in (("rmse", "RMSE"), ("crps", "CRPS")):
        fig = saved[f"scorecard_{metric}.png"]
        ax = _visible(fig)[0]
        rel = 100 * card["rel_diff"].sel(metric=metric).transpose("channel", "lead_time").values
        image = ax.get_images()[0]
        np.testing.assert_allclose(image.get_array(), rel)
        assert image.get_cmap().name == "RdBu_r" and image.norm.vmin == -image.norm.vmax  # centred at 0
        low, high = to_rgba(image.get_cmap()(0.0)), to_rgba(image.get_cmap()(1.0))
        assert low[2] > low[0] and high[0] > high[2]  # negative (forecast better) blue, positive red
        sig = card["significant"].sel(metric=metric).transpose("channel", "lead_time").values == 1
        dots = ax.collections[0].get_offsets()
        np.testing.assert_allclose(np.sort(np.round(dots[:, 1] + 0.3)), np.sort(np.nonzero(sig)[0]))
        assert len(dots) == int(sig.sum()) and 0 < len(dots) < sig.size
        assert [t.get_text() for t in ax.get_yticklabels()] == list(card["channel"].values)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["6", "12", "18", "24"]
        assert ax.get_xlabel() == "lead time [h]" and "baseline: persistence" in ax.get_title()
        colorbar = [a for a in fig.axes if a.get_label() == "<colorbar>"][0]
        label = colorbar.get_ylabel()
        assert label.startswith(f"{name} difference [%]") and "100 (forecast / baseline - 1)" in label
        assert "blue: forecast lower (better)" in label
        assert [t.get_text() for t in fig.legends[0].get_texts()] == ["significant (Diebold-Mariano, p < 0.05)"]
        cells = {t.get_text() for t in ax.texts}
        assert f"{rel[0, -1]:+.1f}" in cells and np.abs(rel).max() > 1  # one decimal for percents above 1


def test_heatmap_of_tiny_differences_keeps_a_span_and_shows_them(compared):
    card, _, _, _ = compared
    tiny = card.copy()
    tiny["rel_diff"] = card["rel_diff"] * (0.0005 / float(np.abs(card["rel_diff"].sel(metric="rmse")).max()))
    fig = plots.plot_heatmap(tiny, "rmse")
    ax = _visible(fig)[0]
    image = ax.get_images()[0]
    assert image.norm.vmin == -plots.HEATMAP_MIN_SPAN and image.norm.vmax == plots.HEATMAP_MIN_SPAN  # not +-0.05
    rel = 100 * tiny["rel_diff"].sel(metric="rmse").transpose("channel", "lead_time").values
    cells = {t.get_text() for t in ax.texts}
    largest = np.unravel_index(np.abs(rel).argmax(), rel.shape)
    assert f"{rel[largest]:+.3f}" in cells and "-0.0" not in cells and "+0.0" not in cells
    assert all(t.get_color() == "black" for t in ax.texts)  # pale cells, dark digits


def test_maps_and_rank_histograms_are_labelled(compared):
    _, _, saved, _ = compared
    fig = saved["maps_geopotential_500.png"]
    bars = [a.get_ylabel() for a in fig.axes if a.get_label() == "<colorbar>"]
    assert set(bars) == {"[m² s⁻²]"}  # the panel's title names the score; a short bar label is never cut off
    ax = _visible(fig)[0]
    assert ax.get_xlabel() == "longitude [°E]" and ax.get_ylabel() == "latitude [°N]"
    assert ax.get_title() == "CRPS geopotential_500 +6 h" and fig.get_suptitle() == "time mean over 16 initialisations"
    hist = _visible(saved["rank_histogram.png"])[0]
    assert hist.get_xlabel() == "rank of truth among members" and hist.get_ylabel() == "frequency"


def test_result_states_the_sign_convention_and_baseline_scores(compared):
    card, result, _, _ = compared
    assert result["rel_diff_convention"] == REL_DIFF_CONVENTION == card.attrs["rel_diff_convention"]
    assert result["rel_diff_convention"].startswith("forecast / baseline - 1; negative is better for rmse")
    assert result["baseline"] == "baseline persistence" and result["units"] == UNITS
    for ch in UNITS:
        for h in (6, 24):
            f, b, r = (result[f"{k}rmse.{ch}.{h}h"] for k in ("", "baseline.", "rel_diff."))
            assert r == pytest.approx(f / b - 1, rel=1e-12)
            assert f"baseline.crps.{ch}.{h}h" in result and f"rmse.{ch}.12h" not in result
    assert result["mean_rel_diff.rmse"] == pytest.approx(float(card["rel_diff"].sel(metric="rmse").mean()))


def test_one_member_forecast_maps_are_mae_and_configured_order_is_kept(tmp_path):
    store = make_store(tmp_path / "store.zarr")
    ds = open_store(store)
    fc = persistence_forecast(ds, ds.time.values[:8], [6, 12])
    chans = channels(fc, ["geopotential", "2m_temperature"], [500])
    truth = ds.copy()
    truth["2m_temperature"].attrs = {}  # no units in the truth: the forecast's are used
    fc["2m_temperature"].attrs = {"units": "degC"}
    card = build_scorecard(Model("forecast p.zarr", fc), truth, chans, n_bootstrap=100)
    assert list(card["channel"].values) == ["geopotential_500", "2m_temperature"]
    assert list(card["units"].values) == ["m**2 s**-2", "degC"]
    assert "mae_map" in card and "crps_map" not in card and "rel_diff_convention" not in card.attrs
    figs = dict(plots.figures(card))
    assert not any(n.startswith("scorecard_") for n in figs)  # no baseline: no heatmap
    bars = [a.get_ylabel() for a in figs["maps_2m_temperature.png"].axes if a.get_label() == "<colorbar>"]
    assert bars == ["[degC]"] * 2
    crps = _visible(figs["score_crps.png"])
    assert [ax.get_title() for ax in crps] == ["geopotential_500", "2m_temperature"]
    assert crps[1].get_ylabel() == "CRPS (= MAE, one member) [degC]"
    assert [t.get_text() for t in crps[0].get_legend().get_texts()] == ["forecast: p.zarr"]
    np.testing.assert_array_equal(crps[0].get_xticks(), [6, 12])
