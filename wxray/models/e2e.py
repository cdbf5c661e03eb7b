"""End-to-end observation models (Aardvark-style): an observation encoder and a station decoder.

Encoder, observations -> analysis z0 on the model grid (h, w), in normalised state units:
    e_s  = SetConv_s(stream s) -> (b, 2 C_s, h, w) [density, value] per channel; 0 where s is denied
    x    = concat(e_1 .. e_S in stream order, static)               (b, sum 2 C_s + n_static, h, w)
    z0   = ResSlimViT(PixelMLP(x))                                  (b, n_out, h, w)
PixelMLP maps every pixel to `latent` channels (default n_out): a first guess per state variable, which the
ViT's tokenizer treats as its variables (one patch embedding each, then aggregated over variables). Its
cost grows with the number of those channels, so they stay few; the MLP's own width is `hidden`.
Each stream has its own SetConv, hence its own learnable length scale. A denied stream's channels are exact
zeros, the same as a stream with no observations in the window (density 0 = "absent").

Decoder, state -> station values:
    g    = ConvNet(state)                 (circular padding in longitude when periodic)
    y_p  = MLP(concat(SetConv_{grid->points}([g, state])(p), sin/cos(lat_p, lon_p), features_p))

Batch keys (the data layer's window reader, as torch tensors) per stream: those of the stream's embedding
(`embeddings.py`: points_to_grid reads obs.{s}.coords (b, N, 2), obs.{s}.values / obs.{s}.mask (b, N, C);
grid_to_grid obs.{s}.values / obs.{s}.mask (b, C, hs, ws) on the stream's own grid). SetConv_s is
`setconvs[i]` for the i-th stream whatever its embedding, so checkpoints name it alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from wxray.config import NonNegFloat, NonNegInt, PosFloat, PosInt
from wxray.errors import ConfigError
from wxray.models.embeddings import EMBEDDINGS, StreamInput, grid_axis
from wxray.models.reslim import ResSlimViT
from wxray.models.setconv import ArrayLike, SetConv, grid_spacing_deg


@dataclass
class EncoderConfig:
    hidden: PosInt = 64  # width of the per-pixel MLP between the SetConv embeddings and the ViT
    latent: NonNegInt = 0  # channels the MLP hands the ViT (its tokenizer's variables); 0 = the state's channels
    patch_size: PosInt = 4  # pixels per ViT token side (the processor's too: one grid)
    embed_dim: PosInt = 128  # ViT token width
    depth: PosInt = 4  # ViT blocks
    num_heads: PosInt = 4  # attention heads (must divide embed_dim)
    mlp_ratio: PosFloat = 4.0  # ViT MLP hidden width / embed_dim
    length_scale_deg: NonNegFloat = 0.0  # initial SetConv length scale (learned per stream); 0 = the grid spacing

    def validate(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"encoder.embed_dim={self.embed_dim} is not divisible by "
                              f"encoder.num_heads={self.num_heads}")


class ObsEncoder(nn.Module):
    """Observation streams + static fields -> analysis (b, n_out, h, w); see the module docstring.

    `length_scale_deg=None` starts every stream's length scale at the model grid spacing. `static` holds
    whatever the platform prepares per pixel (constant fields, climatology, time features): n_static channels.
    """

    def __init__(
        self,
        streams: list[StreamInput],
        latitude: ArrayLike,
        longitude: ArrayLike,
        n_static: int,
        n_out: int,
        *,
        hidden: int = 64,
        latent: int | None = None,
        patch_size: int = 2,
        embed_dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        length_scale_deg: float | None = None,
        periodic_longitude: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        names = [s.name for s in streams]
        if not streams or len(set(names)) != len(names):
            raise ValueError(f"need at least one stream, with unique names; got {names}")
        if n_static < 0 or n_out < 1 or hidden < 1:
            raise ValueError(f"need n_static >= 0, n_out >= 1, hidden >= 1; got {n_static}, {n_out}, {hidden}")
        self.streams = list(streams)
        self.n_static, self.n_out = n_static, n_out
        self.register_buffer("latitude", grid_axis(latitude, "latitude"), persistent=False)
        self.register_buffer("longitude", grid_axis(longitude, "longitude"), persistent=False)
        self.img_size = (self.latitude.numel(), self.longitude.numel())
        ls = length_scale_deg if length_scale_deg is not None else grid_spacing_deg(self.latitude, self.longitude)
        # a ModuleList, not a ModuleDict: stream names such as "keys" or "update" would clash with its methods
        self.setconvs = nn.ModuleList(SetConv(ls, periodic=periodic_longitude) for _ in streams)
        for i, s in enumerate(streams):  # an embedding's constants, e.g. a stream's own grid: buffers f"{c}_{i}"
            emb = EMBEDDINGS[s.embedding]
            for c, t in zip(emb.constants, emb.constant_values(s), strict=True):
                self.register_buffer(f"{c}_{i}", t, persistent=False)
        offsets = [0]
        for s in streams:
            offsets.append(offsets[-1] + 2 * s.n_channels)
        self._slices = {s.name: slice(offsets[i], offsets[i + 1]) for i, s in enumerate(streams)}
        self.n_embed = offsets[-1]

        latent = n_out if latent is None else latent
        self.pixel_mlp = nn.Sequential(
            nn.Conv2d(self.n_embed + n_static, hidden, 1), nn.GELU(), nn.Conv2d(hidden, latent, 1)
        )
        self.backbone = ResSlimViT(
            n_vars=latent, history=1, n_const=0, n_out=n_out, img_size=self.img_size, patch_size=patch_size,
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, keep_ratio=1.0,
            dropout=dropout, periodic_longitude=periodic_longitude,
        )

    def stream_channels(self, name: str) -> slice:
        """The channels of stream `name` in `embed`'s output: [density_0, value_0, ...] of that stream."""
        if name not in self._slices:
            raise ValueError(f"unknown stream {name!r}; the encoder's streams are {', '.join(self._slices)}")
        return self._slices[name]

    def _check_keys(self, obs: Mapping[str, Tensor], deny: Sequence[str]) -> None:
        for name in deny:
            self.stream_channels(name)  # raises on an unknown name
        expected = set()
        for s in self.streams:
            emb = EMBEDDINGS[s.embedding]
            for part in emb.required:
                if f"obs.{s.name}.{part}" not in obs:
                    raise ValueError(f"missing observation key obs.{s.name}.{part} (stream {s.name!r}, embedded "
                                     f"{s.embedding})")
            expected.update(f"obs.{s.name}.{part}" for part in emb.required + emb.optional)
        for key in obs:
            if key.startswith("obs.") and key not in expected:
                raise ValueError(f"unknown observation key {key}; the encoder's streams are {', '.join(self._slices)}")

    def _embed_stream(self, i: int, s: StreamInput, obs: Mapping[str, Tensor]) -> Tensor:
        emb = EMBEDDINGS[s.embedding]
        constants = [getattr(self, f"{c}_{i}") for c in emb.constants]
        return emb(self.setconvs[i], s, obs, constants, self.latitude, self.longitude)

    def embed(self, obs: Mapping[str, Tensor], deny: Sequence[str] = (), keep: Tensor | None = None) -> Tensor:
        """Per-stream SetConv embeddings in stream order, (b, n_embed, h, w); denied streams exactly 0.

        `keep` (b, n_streams) of 0/1, if given, withholds stream i from sample j where keep[j, i] = 0 (its
        embedding zeroed as by `deny`): denial drawn per sample, as training with random stream dropout needs.
        """
        if isinstance(deny, str):
            deny = (deny,)
        self._check_keys(obs, deny)
        batch = obs[f"obs.{self.streams[0].name}.values"].shape[0]
        if keep is not None and tuple(keep.shape) != (batch, len(self.streams)):
            raise ValueError(f"keep must be (b, n_streams) = {(batch, len(self.streams))}, got {tuple(keep.shape)}")
        parts = []
        for i, s in enumerate(self.streams):
            if s.name in deny:
                parts.append(self.latitude.new_zeros(batch, 2 * s.n_channels, *self.img_size))
            else:
                part = self._embed_stream(i, s, obs)
                parts.append(part if keep is None else part * keep[:, i, None, None, None].to(part.dtype))
            if parts[-1].shape[0] != batch:
                raise ValueError(f"obs.{s.name}.values has batch size {parts[-1].shape[0]}, expected {batch}")
        return torch.cat(parts, dim=1)

    def features(self, obs: Mapping[str, Tensor], static: Tensor | None = None, deny: Sequence[str] = (),
                 keep: Tensor | None = None) -> Tensor:
        """The backbone's input PixelMLP(x), (b, latent, h, w): everything before the ViT (no random draws)."""
        e = self.embed(obs, deny, keep)
        b, (h, w) = e.shape[0], self.img_size
        if static is None and self.n_static == 0:
            static = e.new_zeros(b, 0, h, w)
        if static is None or tuple(static.shape) != (b, self.n_static, h, w):
            got = None if static is None else tuple(static.shape)
            raise ValueError(f"static must be (b, n_static, h, w) = {(b, self.n_static, h, w)}, got {got}")
        return self.pixel_mlp(torch.cat([e, static.to(e.dtype)], dim=1))

    def forward(
        self,
        obs: Mapping[str, Tensor],
        static: Tensor | None = None,
        deny: Sequence[str] = (),
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """obs + static (b, n_static, h, w) -> analysis (b, n_out, h, w); `generator` drives dropout."""
        return self.backbone(self.features(obs, static, deny), generator=generator)


class _GridConv(nn.Module):
    """3x3 conv on a lat-lon grid: circular padding across longitude (periodic), zeros beyond the poles."""

    def __init__(self, c_in: int, c_out: int, periodic: bool):
        super().__init__()
        self.periodic = periodic
        self.conv = nn.Conv2d(c_in, c_out, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = F.pad(x, (1, 1, 0, 0), mode="circular" if self.periodic else "constant")
        return self.conv(F.pad(x, (0, 0, 1, 1)))


@dataclass
class DecoderConfig:
    hidden: PosInt = 64  # width of the grid convolutions and the station MLP
    length_scale_deg: NonNegFloat = 0.0  # initial grid -> station SetConv length scale; 0 = the grid spacing


class StationDecoder(nn.Module):
    """Gridded state (b, n_state, h, w) + station coords (b, N, 2) [+ features (b, N, n_features)] -> (b, N, n_out).

    Features are per-station extras (e.g. normalised altitude) and must be finite; the platform fills gaps.
    """

    def __init__(
        self,
        n_state: int,
        n_out: int,
        latitude: ArrayLike,
        longitude: ArrayLike,
        *,
        hidden: int = 64,
        n_features: int = 0,
        length_scale_deg: float | None = None,
        periodic_longitude: bool = True,
    ):
        super().__init__()
        if n_state < 1 or n_out < 1 or hidden < 1 or n_features < 0:
            raise ValueError(
                f"need n_state, n_out, hidden >= 1 and n_features >= 0; got {n_state}, {n_out}, {hidden}, {n_features}"
            )
        self.n_state, self.n_out, self.n_features = n_state, n_out, n_features
        self.register_buffer("latitude", grid_axis(latitude, "latitude"), persistent=False)
        self.register_buffer("longitude", grid_axis(longitude, "longitude"), persistent=False)
        self.img_size = (self.latitude.numel(), self.longitude.numel())
        self.convs = nn.Sequential(
            _GridConv(n_state, hidden, periodic_longitude), nn.GELU(),
            _GridConv(hidden, hidden, periodic_longitude), nn.GELU(),
        )
        ls = length_scale_deg if length_scale_deg is not None else grid_spacing_deg(self.latitude, self.longitude)
        self.setconv = SetConv(ls, periodic=periodic_longitude)
        n_in = hidden + n_state + 4 + n_features
        self.mlp = nn.Sequential(
            nn.Linear(n_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, n_out)
        )

    def forward(self, state: Tensor, coords: Tensor, features: Tensor | None = None) -> Tensor:
        b = state.shape[0]
        if state.ndim != 4 or tuple(state.shape[1:]) != (self.n_state, *self.img_size):
            raise ValueError(f"state must be (b, {self.n_state}, {self.img_size[0]}, {self.img_size[1]}), "
                             f"got {tuple(state.shape)}")
        if coords.ndim != 3 or coords.shape[0] != b or coords.shape[-1] != 2:
            raise ValueError(f"coords must be (b={b}, N, 2) (latitude, longitude), got {tuple(coords.shape)}")
        n = coords.shape[1]
        if self.n_features and (features is None or tuple(features.shape) != (b, n, self.n_features)):
            got = None if features is None else tuple(features.shape)
            raise ValueError(f"features must be (b, N, n_features) = {(b, n, self.n_features)}, got {got}")
        if not self.n_features and features is not None and features.shape[-1] != 0:
            raise ValueError(f"decoder built with n_features=0 got features {tuple(features.shape)}")
        grid = torch.cat([self.convs(state), state], dim=1)
        at_station = self.setconv.grid_to_points(grid, self.latitude, self.longitude, coords)
        rad = torch.deg2rad(coords.float())
        parts = [at_station, rad.sin(), rad.cos()]
        if self.n_features:
            parts.append(features.to(at_station.dtype))
        return self.mlp(torch.cat(parts, dim=-1))
