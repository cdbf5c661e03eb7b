"""Physical bounds of observed values: what a station table may hold before it enters a stream and its
statistics (`wxray.data.obs.prepare`).

A value is refused when it is not finite (inf) or lies outside [lo, hi] of its variable: one inf or a 1e30
sentinel would otherwise become the stream's mean. The bounds are generous (beyond any recorded extreme,
in the units ERA5 uses: K, Pa, m s-1, m2 s-2, kg kg-1, %, m); a variable not listed here gets
|x| <= GENERIC. A job overrides them per variable (`bounds: {2m_temperature: [200, 330]}`).
"""

from __future__ import annotations

import numpy as np

from wxray.errors import DataError

GENERIC = 1e7  # |x| for a variable without its own bounds: catches fill values (1e20, 9.96921e36)

BOUNDS: dict[str, tuple[float, float]] = {
    "2m_temperature": (150.0, 350.0),
    "2m_dewpoint_temperature": (150.0, 350.0),
    "temperature": (150.0, 350.0),
    "sea_surface_temperature": (260.0, 320.0),
    "mean_sea_level_pressure": (85_000.0, 110_000.0),
    "surface_pressure": (30_000.0, 110_000.0),
    "10m_u_component_of_wind": (-100.0, 100.0),
    "10m_v_component_of_wind": (-100.0, 100.0),
    "10m_wind_speed": (0.0, 100.0),
    "u_component_of_wind": (-200.0, 200.0),
    "v_component_of_wind": (-200.0, 200.0),
    "wind_speed": (0.0, 200.0),
    "vertical_velocity": (-50.0, 50.0),
    "geopotential": (-10_000.0, 600_000.0),
    "specific_humidity": (0.0, 0.1),
    "relative_humidity": (0.0, 110.0),
    "total_precipitation": (0.0, 2.0),
    "total_column_water_vapour": (0.0, 120.0),
    "total_cloud_cover": (0.0, 1.0),
}


def bounds_of(variable: str, overrides: dict[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    return (overrides or {}).get(variable) or BOUNDS.get(variable, (-GENERIC, GENERIC))


def check_values(x: np.ndarray, variable: str, column: str, where: str,
                 overrides: dict[str, tuple[float, float]] | None = None) -> None:
    """DataError naming the first value (and its data row) that is infinite or outside the bounds; NaN is
    'not reported' and passes."""
    lo, hi = bounds_of(variable, overrides)
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(np.isinf(x) | (x < lo) | (x > hi))
    if bad.size:
        i = int(bad[0])
        what = "is not finite" if np.isinf(x[i]) else f"lies outside the physical bounds [{lo:g}, {hi:g}]"
        raise DataError(f"{where}: column '{column}' (variable '{variable}'): {x[i]:g} (data row {i + 1}) {what}"
                        f"{'' if np.isinf(x[i]) else f'; set bounds.{variable}=[lo, hi] if it is right'}")
