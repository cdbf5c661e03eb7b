"""Fitting a store's latitude x longitude grid to the model's patch size p: `data.grid_fit`.

WeatherBench 2 / ERA5 equiangular grids carry both poles, so their height is odd (1.0 deg: 181 x 360,
1.5 deg: 121 x 240, 0.25 deg: 721 x 1440) and no patch size > 1 divides it. The *kept* grid is the part
of the store that is forecast and scored; the *model* grid is the kept grid plus padding, and p
divides it:

- ``crop`` (default) keeps a sub-grid: of the k = h mod p surplus rows, ceil(k/2) go at the south edge
  and floor(k/2) at the north edge. The store's latitude ascends (south to north), so for k = 1 the
  -90 row goes: the *last* row in WeatherBench 2's north-to-south order, as the paper does (181 -> 180
  rows, L = 16200 tokens at p = 2). Surplus columns go at the east end (the last longitudes).
- ``pad`` keeps the whole grid and pads it: n = (-h) mod p rows by reflection about the edge row
  (numpy ``reflect``: the edge row is not repeated), ceil(n/2) at the south edge and floor(n/2) at the
  north; columns are padded at the east end, *periodically* (wrap) on a global grid, where longitude is
  periodic, and by reflection on a regional one, whose east and west edges are not neighbours. Padded
  rows and columns are not data: `unpad` removes them from every prediction before the loss, the
  scores and the forecast store, and a rollout re-pads its kept-grid state before the next step.
- ``error`` refuses a grid that p does not divide.

Invariants: ``unpad(pad(a)) == a`` for every field ``a`` on the kept grid; everything written or scored
(forecast store, latitude weights, climatology) is on the kept grid; the model sees `model_grid`.
Numpy arrays and torch tensors go through the same functions (last two axes: latitude, longitude).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from wxray.errors import ConfigError

GridFitMode = Literal["error", "crop", "pad"]
GRID_FIT_MODES = ("error", "crop", "pad")


@dataclass(frozen=True)
class GridFit:
    """Kept store rows/columns (half-open index ranges) and the padding around them."""

    mode: str  # "none" (never fitted), or the data.grid_fit that made it
    rows: tuple[int, int]  # [start, stop) of the kept store rows (ascending latitude)
    cols: tuple[int, int]  # [start, stop) of the kept store columns
    pad_rows: tuple[int, int] = (0, 0)  # (south, north) reflected rows
    pad_cols: tuple[int, int] = (0, 0)  # (west, east) padded columns
    periodic: bool = True  # global grid: columns pad by wrapping; regional: by reflection

    @classmethod
    def identity(cls, h: int, w: int) -> GridFit:
        return cls("none", (0, h), (0, w))

    @property
    def kept_grid(self) -> tuple[int, int]:
        return self.rows[1] - self.rows[0], self.cols[1] - self.cols[0]

    @property
    def model_grid(self) -> tuple[int, int]:
        h, w = self.kept_grid
        return h + sum(self.pad_rows), w + sum(self.pad_cols)

    @property
    def padded(self) -> bool:
        return any(self.pad_rows) or any(self.pad_cols)

    def pad(self, a):
        """Kept grid (..., h, w) -> model grid (..., H, W); numpy or torch."""
        if not self.padded:
            return a
        h, w = self.kept_grid
        a = _take(a, np.pad(np.arange(h), self.pad_rows, mode="reflect"), -2)
        return _take(a, np.pad(np.arange(w), self.pad_cols, mode="wrap" if self.periodic else "reflect"), -1)

    def row_weights(self, w):
        """Kept-row weights (h,) -> model-grid rows (H,), 0 on padded rows; numpy or torch."""
        if not any(self.pad_rows):
            return w
        if isinstance(w, np.ndarray):
            return np.pad(w, self.pad_rows)
        import torch

        return torch.nn.functional.pad(w, self.pad_rows)

    def unpad(self, a):
        """Model grid (..., H, W) -> kept grid (..., h, w): a view, no copy."""
        if not self.padded:
            return a
        (s, _), (west, _) = self.pad_rows, self.pad_cols
        h, w = self.kept_grid
        return a[..., s: s + h, west: west + w]


def _take(a, index: np.ndarray, axis: int):
    if isinstance(a, np.ndarray):
        return np.take(a, index, axis=axis)
    import torch

    return a.index_select(axis % a.ndim, torch.as_tensor(index, device=a.device))


def fit_grid(h: int, w: int, patch_size: int, mode: str, periodic: bool = True) -> GridFit:
    """The fit of an h x w grid to `patch_size` (index ranges relative to that grid); `periodic`: global."""
    p = int(patch_size)
    if mode not in GRID_FIT_MODES:
        raise ConfigError(f"data.grid_fit must be one of {', '.join(GRID_FIT_MODES)}, got {mode!r}")
    if h % p == 0 and w % p == 0:
        return GridFit(mode, (0, h), (0, w))
    if mode == "error":
        raise ConfigError(f"model.patch_size={p} does not divide the grid {h}x{w} and data.grid_fit=error "
                          "(data.grid_fit=crop or pad fits it)")
    if mode == "crop":
        if p > h or p > w:
            raise ConfigError(f"data.grid_fit=crop: model.patch_size={p} is larger than the grid {h}x{w}")
        k = h % p
        return GridFit(mode, (-(-k // 2), h - k // 2), (0, w - w % p))
    n = -h % p
    if h < 2 and n:
        raise ConfigError(f"data.grid_fit=pad: a grid of {h} row cannot be padded by reflection")
    if not periodic and w < 2 and w % p:
        raise ConfigError(f"data.grid_fit=pad: a regional grid of {w} column cannot be padded by reflection")
    return GridFit(mode, (0, h), (0, w), pad_rows=(-(-n // 2), n // 2), pad_cols=(0, -w % p), periodic=periodic)
