"""SetConv: Gaussian-RBF set convolution between scattered points and lat-lon grids (Aardvark's convDeepSet).

Weights are separable per axis, in degrees, with one learnable length scale l (a registered parameter,
stored as log l so it stays positive; trained and saved with the model):

    w(p, i, j) = exp(-0.5 dlat(p, i)^2 / l^2) * exp(-0.5 dlon(p, j)^2 / l^2)
    dlat = lat_p - lat_i;  dlon = lon_p - lon_j, wrapped to [-180, 180) when periodic

Distances are plain degrees (lat-lon boxes, not great circles), as in Aardvark; the wrap makes 359.9 deg and
0 deg neighbours. Three modes:

  points -> grid, grid -> grid (the encoder side), per channel c, with m the presence mask (NaN -> absent):
    density_c(i, j) = sum_p w(p, i, j) m_pc
    value_c(i, j)   = sum_p w(p, i, j) m_pc v_pc / max(density_c(i, j), EPS)
    output channels [density_0, value_0, density_1, value_1, ...]
  grid -> points (the decoder side), Nadaraya-Watson:
    f(p) = sum_ij w(p, i, j) F(i, j) / sum_ij w(p, i, j)

Invariant: a channel with no present observation gives exactly 0 in both its output channels (every term of
both sums is an exact 0), so a denied or empty stream reads as "absent", never as "mean value".

Cost: the separable form contracts one axis at a time, O(N h w C) time and O(N C min-axis) memory; the
(N, h*w) weight tensor is never built. All sums run in float32 with autocast off: a density is a sum of up
to N weights, and bf16 would round the small ones away.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor

# 360 / 64: the longitude spacing of the embedded default grid (32 x 64); "about one grid step"
DEFAULT_LENGTH_SCALE_DEG = 5.625
# densities below this count as "no observation nearby" in the division (w = 1e-5 is 4.8 length scales out)
EPS = 1e-5

ArrayLike = Tensor | Sequence[float]


def grid_spacing_deg(latitude: ArrayLike, longitude: ArrayLike) -> float:
    """Mean of the median latitude and median longitude steps of a grid (deg): a default length scale."""
    steps = []
    for axis in (latitude, longitude):
        a = torch.as_tensor(axis, dtype=torch.float64).flatten()
        if a.numel() > 1:
            steps.append(a.diff().abs().median().item())
    return float(sum(steps) / len(steps)) if steps else DEFAULT_LENGTH_SCALE_DEG


class SetConv(nn.Module):
    """Gaussian set convolution with a learnable length scale (deg); see the module docstring.

    points_to_grid(coords (b,N,2), values (b,N,C), mask (b,N,C), lat (h,), lon (w,)) -> (b, 2C, h, w)
    grid_to_grid(values (b,C,hs,ws), mask (b,C,hs,ws), src_lat (hs,), src_lon (ws,), lat, lon) -> (b, 2C, h, w)
    grid_to_points(field (b,C,h,w), lat (h,), lon (w,), coords (b,N,2)) -> (b, N, C)
    coords are (latitude, longitude) in degrees; longitudes in any convention (differences are wrapped).
    """

    def __init__(self, length_scale_deg: float = DEFAULT_LENGTH_SCALE_DEG, periodic: bool = True):
        super().__init__()
        if not (math.isfinite(length_scale_deg) and length_scale_deg > 0):
            raise ValueError(f"length_scale_deg must be a positive number, got {length_scale_deg}")
        self.periodic = periodic
        self.log_length_scale = nn.Parameter(torch.tensor(math.log(length_scale_deg), dtype=torch.float32))

    @property
    def length_scale(self) -> Tensor:
        """The length scale in degrees (a differentiable scalar)."""
        return self.log_length_scale.exp()

    def extra_repr(self) -> str:
        return f"length_scale_deg={self.length_scale.item():.4g}, periodic={self.periodic}"

    # --- weights -------------------------------------------------------------------------------------

    def _log_weights(self, x: Tensor, nodes: Tensor, wrap: bool) -> Tensor:
        """(..., n) x (m,) -> (..., n, m): -0.5 d^2 / l^2 along one axis."""
        d = x.unsqueeze(-1) - nodes
        if wrap:
            d = torch.remainder(d + 180.0, 360.0) - 180.0
        return -0.5 * (d / self.length_scale) ** 2

    def _axis_weights(self, x: Tensor, nodes: Tensor, wrap: bool) -> Tensor:
        return self._log_weights(x, nodes, wrap).exp()

    # --- modes ---------------------------------------------------------------------------------------

    def points_to_grid(self, coords: Tensor, values: Tensor, mask: Tensor, lat: ArrayLike, lon: ArrayLike) -> Tensor:
        """Scattered observations -> [density, value] per channel on the grid (lat, lon); (b, 2C, h, w)."""
        if coords.ndim != 3 or coords.shape[-1] != 2:
            raise ValueError(f"coords must be (b, N, 2) (latitude, longitude), got {tuple(coords.shape)}")
        b, n = coords.shape[:2]
        if values.ndim != 3 or values.shape[:2] != (b, n) or mask.shape != values.shape:
            raise ValueError(
                f"values and mask must both be (b, N, C) with (b, N) = {(b, n)}, "
                f"got {tuple(values.shape)} and {tuple(mask.shape)}"
            )
        with torch.autocast(coords.device.type, enabled=False):
            coords = coords.float()
            lat, lon = _axis(lat, coords), _axis(lon, coords)
            # an observation with unknown coordinates is absent; zero them so exp() stays finite
            located = torch.isfinite(coords).all(-1, keepdim=True)
            coords = torch.where(located, coords, 0.0)
            m, v = _present(mask.float() * located, values.float())
            w_lat = self._axis_weights(coords[..., 0], lat, wrap=False)  # (b, N, h)
            w_lon = self._axis_weights(coords[..., 1], lon, wrap=self.periodic)  # (b, N, w)
            x = torch.cat([m, m * v], dim=-1)  # (b, N, 2C): density and numerator terms
            c2, h, w = x.shape[-1], lat.numel(), lon.numel()
            # contract N in two steps: (b, N, 2C*h)^T @ (b, N, w) -> (b, 2C*h, w); O(N 2C h w), no (N, h*w)
            xa = (x.unsqueeze(-1) * w_lat.unsqueeze(2)).reshape(b, n, c2 * h)
            out = (xa.transpose(1, 2) @ w_lon).view(b, c2, h, w)
            return _density_value(out)

    def grid_to_grid(
        self,
        values: Tensor,
        mask: Tensor,
        src_lat: ArrayLike,
        src_lon: ArrayLike,
        lat: ArrayLike,
        lon: ArrayLike,
    ) -> Tensor:
        """A gappy field on its own grid (src_lat, src_lon) -> [density, value] per channel on (lat, lon).

        mask 0 or a NaN value means no data at that pixel and channel; (b, C, hs, ws) -> (b, 2C, h, w).
        """
        if values.ndim != 4 or mask.shape != values.shape:
            raise ValueError(
                f"values and mask must both be (b, C, hs, ws), got {tuple(values.shape)} and {tuple(mask.shape)}"
            )
        with torch.autocast(values.device.type, enabled=False):
            values = values.float()
            src_lat, src_lon = _axis(src_lat, values), _axis(src_lon, values)
            lat, lon = _axis(lat, values), _axis(lon, values)
            if values.shape[-2:] != (src_lat.numel(), src_lon.numel()):
                raise ValueError(
                    f"values grid {tuple(values.shape[-2:])} does not match the source grid "
                    f"({src_lat.numel()}, {src_lon.numel()})"
                )
            m, v = _present(mask.float(), values)
            w_lat = self._axis_weights(src_lat, lat, wrap=False)  # (hs, h)
            w_lon = self._axis_weights(src_lon, lon, wrap=self.periodic)  # (ws, w)
            x = torch.cat([m, m * v], dim=1)  # (b, 2C, hs, ws)
            out = w_lat.T @ (x @ w_lon)  # (b, 2C, h, w): O(hs ws w + hs h w) per channel
            return _density_value(out)

    def grid_to_points(self, field: Tensor, lat: ArrayLike, lon: ArrayLike, coords: Tensor) -> Tensor:
        """Nadaraya-Watson interpolation of field (b, C, h, w) at coords (b, N, 2) -> (b, N, C).

        The normaliser sum_ij w is separable too, so each axis' weights are normalised on their own with a
        softmax: exact N-W, and finite however small the length scale gets.
        """
        if field.ndim != 4 or coords.ndim != 3 or coords.shape[-1] != 2 or coords.shape[0] != field.shape[0]:
            raise ValueError(
                f"expected field (b, C, h, w) and coords (b, N, 2) with the same b, "
                f"got {tuple(field.shape)} and {tuple(coords.shape)}"
            )
        with torch.autocast(field.device.type, enabled=False):
            field, coords = field.float(), coords.float()
            lat, lon = _axis(lat, field), _axis(lon, field)
            b, c, h, w = field.shape
            if (h, w) != (lat.numel(), lon.numel()):
                raise ValueError(f"field grid {(h, w)} does not match lat/lon ({lat.numel()}, {lon.numel()})")
            n = coords.shape[1]
            a_lat = self._log_weights(coords[..., 0], lat, wrap=False).softmax(-1)  # (b, N, h)
            a_lon = self._log_weights(coords[..., 1], lon, wrap=self.periodic).softmax(-1)  # (b, N, w)
            t = field.reshape(b, c * h, w) @ a_lon.transpose(1, 2)  # (b, C*h, N)
            return (t.view(b, c, h, n) * a_lat.transpose(1, 2).unsqueeze(1)).sum(2).transpose(1, 2)


def _axis(nodes: ArrayLike, like: Tensor) -> Tensor:
    """Grid coordinates as a 1-D float32 tensor on `like`'s device."""
    t = torch.as_tensor(nodes, dtype=torch.float32, device=like.device)
    if t.ndim != 1 or t.numel() == 0:
        raise ValueError(f"grid coordinates must be a non-empty 1-D sequence, got shape {tuple(t.shape)}")
    return t


def _present(mask: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """(m, v): m = 1 where mask > 0 and the value is finite, else 0; v = values with absent entries zeroed."""
    m = ((mask > 0) & torch.isfinite(values)).to(values.dtype)
    return m, torch.where(m > 0, values, 0.0)


def _density_value(out: Tensor) -> Tensor:
    """(b, 2C, h, w) stacked [densities..., numerators...] -> interleaved [density_c, value_c, ...]."""
    b, c2, h, w = out.shape
    density, numerator = out[:, : c2 // 2], out[:, c2 // 2 :]
    value = numerator / density.clamp_min(EPS)
    return torch.stack([density, value], dim=2).reshape(b, c2, h, w)
