"""Stream embeddings of the observation encoder: one stream's batch -> [density, value] per channel on the model
grid, (b, 2 C_s, h, w), through the stream's own SetConv (`ObsEncoder.setconvs[i]`: its learnable length scale).

    points_to_grid  obs.{s}.coords (b, N, 2), obs.{s}.values and obs.{s}.mask (b, N, C)  -> SetConv.points_to_grid
                    (obs.{s}.id and obs.{s}.altitude (b, N) may ride along: the decoder and scores read them)
    grid_to_grid    obs.{s}.values and obs.{s}.mask (b, C, hs, ws) on the stream's own grid (StreamInput.latitude,
                    .longitude; held by the encoder as buffers src_lat_<i>, src_lon_<i>)  -> SetConv.grid_to_grid

A stream names its embedding (`StreamInput.embedding`). The data layer's stream kinds (`wxray.data.obs.kinds`)
say which embedding their windows feed, so a new stream kind whose batch one of these reads needs nothing here.
A new embedding is one subclass of `Embedding` (its batch keys, its checks of the stream and of the batch's
shapes, its SetConv mode) plus one line in `EMBEDDINGS`; a stream kind then names it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from wxray.models.setconv import ArrayLike, SetConv


@dataclass
class StreamInput:
    """What the encoder needs to know of a stream: its name, embedding, channel count and (grid_to_grid) its grid."""

    name: str
    embedding: str  # a key of EMBEDDINGS
    n_channels: int
    latitude: tuple[float, ...] = ()
    longitude: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "." in self.name:
            raise ValueError(f"stream name {self.name!r} must be non-empty and contain no '.'")
        if not isinstance(self.embedding, str) or self.embedding not in EMBEDDINGS:
            raise ValueError(f"stream {self.name!r}: embedding must be one of {tuple(EMBEDDINGS)}, "
                             f"got {self.embedding!r}")
        if self.n_channels < 1:
            raise ValueError(f"stream {self.name!r}: n_channels must be >= 1, got {self.n_channels}")
        self.latitude = tuple(float(x) for x in self.latitude)
        self.longitude = tuple(float(x) for x in self.longitude)
        EMBEDDINGS[self.embedding].check(self)


def grid_axis(values: ArrayLike, what: str) -> Tensor:
    """A grid axis (degrees) as a float32 tensor; ValueError naming `what` if empty or not finite."""
    t = torch.as_tensor(values, dtype=torch.float32).flatten().clone()
    if t.numel() == 0 or not torch.isfinite(t).all():
        raise ValueError(f"{what} must be a non-empty sequence of finite degrees")
    return t


class Embedding(ABC):
    """How the batch of one stream becomes its SetConv embedding on the model grid (see the module docstring)."""

    name: ClassVar[str]
    required: ClassVar[tuple[str, ...]]  # batch keys obs.<s>.<key> it reads
    optional: ClassVar[tuple[str, ...]] = ()  # keys a batch may also hold for the stream (read elsewhere)
    constants: ClassVar[tuple[str, ...]] = ()  # per-stream tensors the encoder holds as buffers f"{name}_{i}"

    def check(self, s: StreamInput) -> None:
        """ValueError when the stream's description lacks what this embedding needs."""
        return None  # a stream's name and channel count suffice

    def constant_values(self, s: StreamInput) -> tuple[Tensor, ...]:
        """The tensors of `constants`, in their order."""
        return ()

    @abstractmethod
    def __call__(self, conv: SetConv, s: StreamInput, obs: Mapping[str, Tensor], constants: Sequence[Tensor],
                 latitude: Tensor, longitude: Tensor) -> Tensor:
        """(b, 2 C_s, h, w) on the model grid (latitude, longitude); ValueError naming the key on a bad shape."""


class PointsToGrid(Embedding):
    name = "points_to_grid"
    required = ("coords", "values", "mask")
    optional = ("id", "altitude")

    def __call__(self, conv, s, obs, constants, latitude, longitude):
        values, mask, coords = (obs[f"obs.{s.name}.{k}"] for k in ("values", "mask", "coords"))
        if values.ndim != 3 or values.shape[-1] != s.n_channels or coords.shape[:2] != values.shape[:2]:
            raise ValueError(
                f"obs.{s.name}.values must be (b, N, {s.n_channels}) matching obs.{s.name}.coords (b, N, 2); "
                f"got {tuple(values.shape)} and {tuple(coords.shape)}"
            )
        return conv.points_to_grid(coords, values, mask, latitude, longitude)


class GridToGrid(Embedding):
    name = "grid_to_grid"
    required = ("values", "mask")
    constants = ("src_lat", "src_lon")

    def check(self, s: StreamInput) -> None:
        if not (s.latitude and s.longitude):
            raise ValueError(f"stream {s.name!r} ({self.name}) needs its own latitude and longitude")

    def constant_values(self, s: StreamInput) -> tuple[Tensor, ...]:
        return grid_axis(s.latitude, f"{s.name} latitude"), grid_axis(s.longitude, f"{s.name} longitude")

    def __call__(self, conv, s, obs, constants, latitude, longitude):
        values, mask = obs[f"obs.{s.name}.values"], obs[f"obs.{s.name}.mask"]
        src_lat, src_lon = constants
        if values.ndim != 4 or tuple(values.shape[1:]) != (s.n_channels, src_lat.numel(), src_lon.numel()):
            raise ValueError(
                f"obs.{s.name}.values must be (b, {s.n_channels}, {src_lat.numel()}, {src_lon.numel()}), "
                f"got {tuple(values.shape)}"
            )
        return conv.grid_to_grid(values, mask, src_lat, src_lon, latitude, longitude)


EMBEDDINGS: dict[str, Embedding] = {
    PointsToGrid.name: PointsToGrid(),
    GridToGrid.name: GridToGrid(),
}
