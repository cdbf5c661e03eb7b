"""Field maps a meteorologist accepts (issue 28 item 6): units on every colour bar, latitude/longitude axes, the
valid time, a diverging scale for signed fields and differences; the variance-split maps in squared units."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from matplotlib.figure import Figure

from wxray.data.schema import LEAD
from wxray.verify.field_plots import map_scale, plot_field_rows
from wxray.verify.units import pretty_units, units_label
from wxray.verify.variance import COMPONENT
from wxray.verify.variance_plots import plot_curves, plot_maps


@pytest.mark.parametrize(("cf", "shown"), [("m**2 s**-2", "m² s⁻²"), ("m s**-1", "m s⁻¹"), ("m s-1", "m s⁻¹"),
                                           ("K", "K"), ("kg m**-2", "kg m⁻²"), ("1", ""), ("", ""), ("s**-1", "s⁻¹")])
def test_cf_units_read_as_written_by_hand(cf, shown):
    assert pretty_units(cf) == shown


def test_units_label_squares_for_variances():
    assert units_label("m s**-1") == "[m s⁻¹]" and units_label("m s**-1", 2) == "[(m s⁻¹)²]"
    assert units_label("K", 2) == "[(K)²]" and units_label("1", 2) == ""


def test_signed_fields_get_a_diverging_scale_centred_at_zero():
    rng = np.random.default_rng(0)
    wind = rng.normal(2.0, 10.0, (16, 32))
    scale = map_scale(wind)
    assert scale["cmap"] == "RdBu_r" and scale["vmin"] == -scale["vmax"] > -60
    height = 50_000 + rng.normal(0, 500, (16, 32))
    scale = map_scale(height)
    assert scale["cmap"] == "viridis" and 48_000 < scale["vmin"] < scale["vmax"] < 52_000
    assert map_scale(np.abs(wind) + 1, signed=True)["cmap"] == "RdBu_r"  # a difference row, whatever its sign


def test_field_rows_carry_units_axes_time_and_diverging_differences():
    rng = np.random.default_rng(1)
    lat, lon = np.linspace(-80, 80, 9), np.arange(0, 360, 20.0)
    truth = np.stack([50_000 + rng.normal(0, 300, (9, 18)), rng.normal(0, 8, (9, 18))])
    analysis = truth + rng.normal(0, 1, truth.shape)
    fig = plot_field_rows([("truth", truth), ("analysis", analysis), ("analysis - truth", analysis - truth)],
                          ["geopotential_500", "u_component_of_wind_500"], ["m**2 s**-2", "m s**-1"], lat, lon,
                          "valid 2020-01-01 06:00 UTC", difference_rows=(2,))
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    bars = [ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert bars == ["[m² s⁻²]"] * 3 + ["[m s⁻¹]"] * 3  # column by column
    assert fig.get_suptitle() == "valid 2020-01-01 06:00 UTC"
    cmaps = [ax.collections[0].get_cmap().name for ax in panels]
    assert cmaps == ["viridis", "RdBu_r", "viridis", "RdBu_r", "RdBu_r", "RdBu_r"]  # height, wind; differences
    assert panels[0].get_ylabel() == "latitude [°N]" and panels[-1].get_xlabel() == "longitude [°E]"
    first, second = (ax.collections[0].norm for ax in panels[:3:2])
    assert (first.vmin, first.vmax) == (second.vmin, second.vmax)  # truth and analysis share a scale


def test_variance_maps_and_curves_name_units_axes_and_inits(tmp_path):
    leads = pd.to_timedelta([0, 6, 12], unit="h")
    lat, lon = np.linspace(-60, 60, 5), np.arange(0, 360, 45.0)
    comps = ["u_enc", "u_drop", "u_total", "rho_drop"]
    values = np.abs(np.random.default_rng(2).normal(1, 0.3, (4, 3, 5, 8)))
    maps = xr.Dataset({"u_component_of_wind": ((COMPONENT, LEAD, "latitude", "longitude"), values)},
                      coords={COMPONENT: comps, LEAD: leads, "latitude": lat, "longitude": lon})
    units = {"u_component_of_wind": "m s**-1"}
    saved = {}
    real = Figure.savefig

    def keep(self, path, *args, **kwargs):  # the figures as saved, to read their labels back
        saved[str(path)] = self
        return real(self, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", keep)
        paths = plot_maps(maps, tmp_path, units, inits=12)
        plot_curves(maps.mean(["latitude", "longitude"]), tmp_path, units)
    assert [p.name for p in paths] == ["variance_maps_u_component_of_wind.png"] and paths[0].stat().st_size > 0
    fig = saved[str(paths[0])]
    bars = [ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert bars == ["[(m s⁻¹)²]"] * 3 + ["share of U_total"]
    assert "mean over 12 initialisations" in fig.get_suptitle()
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert panels[0].get_ylabel() == "latitude [°N]" and panels[-1].get_xlabel() == "longitude [°E]"
    curves = saved[str(tmp_path / "variance_curves.png")]
    assert curves.axes[0].get_xlabel() == "lead time [h]" and curves.axes[0].get_ylabel() == "domain mean [(m s⁻¹)²]"
