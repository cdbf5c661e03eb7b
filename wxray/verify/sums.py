"""Per-point sums over initialisations that add across blocks of inits: what a time-mean map is made of.

    TimeSum.of(field)       total = sum over the block's inits, count = the inits summed, per point
    a + b                   the sums of two blocks (any split of the inits gives the same mean, to rounding)
    mean()                  total / count: xarray's `field.mean("init_time", skipna=skipna)` of all inits

With skipna a NaN is left out of both (a point never valid is NaN); without it a NaN makes its point NaN.
A latitude band's sums go in at its rows (`place`), so a map is assembled from bands too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from wxray.data.schema import INIT, LAT, LON


@dataclass
class TimeSum:
    """Sum and count over inits per (latitude, longitude) point."""

    total: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, field: xr.DataArray, skipna: bool) -> TimeSum:
        a = field.transpose(INIT, LAT, LON).values
        if skipna:
            valid = ~np.isnan(a)
            return cls(np.where(valid, a, 0.0).sum(axis=0), valid.sum(axis=0))
        return cls(a.sum(axis=0), np.full(a.shape[1:], a.shape[0]))

    @classmethod
    def zeros(cls, shape: tuple[int, int]) -> TimeSum:
        return cls(np.zeros(shape), np.zeros(shape, dtype=np.int64))

    def __add__(self, other: TimeSum) -> TimeSum:
        return TimeSum(self.total + other.total, self.count + other.count)

    def place(self, part: TimeSum, rows: slice) -> None:
        """Add a latitude band's sums at its rows (in place)."""
        self.total[rows] += part.total
        self.count[rows] += part.count

    def mean(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.count > 0, self.total / np.maximum(self.count, 1), np.nan)
