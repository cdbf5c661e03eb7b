"""The end-to-end stages as modules: built from a stage's config, identified for its checkpoints, loaded from a
stages folder, and the stations the decoder forecasts at.

    observations -> encoder -> analysis z0 -> processor (a forecaster of models.registry) -> ... -> decoder

A stages folder (`runs/train_e2e/<run_name>`) holds one run per stage (`<stage>/config.yaml` and
`<stage>/ray/checkpoint_*`); `StageModels` is what a stage's config says of its models and data, which is all
inference needs of it (`trained_stage`). Station values are normalised by the station stream's statistics
(obs.yaml); station heights enter the decoder in km.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from torch import nn

from wxray.config import from_dict, to_dict
from wxray.config_yaml import load_yaml
from wxray.data.e2e_windows import E2EData, ObsDataConfig
from wxray.data.obs.kinds import kind_of
from wxray.data.windows import WindowSpec
from wxray.errors import CheckpointError, ConfigError
from wxray.forecast import checkpoints
from wxray.forecast.state import obs_of, processor_input
from wxray.models import DecoderConfig, EncoderConfig, ObsEncoder, StationDecoder, StreamInput
from wxray.models.registry import ModelConfig, build_forecaster

STAGES = ("encoder", "processor", "decoder", "chain")
Stage = Literal["encoder", "processor", "decoder", "chain"]


@dataclass
class StageModels:
    """The models and data of an end-to-end stage: the part of its training config (`jobs/train_e2e.py`) that
    inference reads back."""

    stage: Stage = "encoder"  # encoder | processor | decoder | chain (platform/train/stage_config.py)
    data: ObsDataConfig = field(default_factory=lambda: ObsDataConfig(history=1, lead_steps=1, batch_size=8))
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    processor: ModelConfig = field(default_factory=lambda: ModelConfig(patch_size=4, depth=6, split=(2, 2, 2),
                                                                       keep_ratio=0.5))
    decoder: DecoderConfig = field(default_factory=DecoderConfig)


C = TypeVar("C", bound=StageModels)


def trained_stage(stages: Path, name: str, cls: type[C] = StageModels) -> tuple[Path, C] | None:
    """(newest checkpoint, config as `cls`) of stage `name` under `stages`, None if it never checkpointed."""
    run = Path(stages) / name
    last = checkpoints.latest(run / "ray")
    if last is None:
        return None
    if not (run / "config.yaml").is_file():
        raise CheckpointError(f"stage {run}: config.yaml is missing (it records how the stage was trained)")
    keys = {f.name for f in fields(cls)}
    try:
        saved = {k: v for k, v in load_yaml(run / "config.yaml").items() if k in keys}
        return last, from_dict(cls, saved, saved=True)
    except ConfigError as e:
        raise CheckpointError(f"stage {run}: its config.yaml does not load here ({e})") from None


def stream_inputs(data: E2EData) -> list[StreamInput]:
    """The encoder's view of every stream: the embedding its kind names, its channels [and its own grid]."""
    return [StreamInput(name=s.name, **kind_of(s).encoder_input(s)) for s in data.obs.streams]


def build_encoder(cfg: StageModels, data: E2EData) -> ObsEncoder:
    e, spec = cfg.encoder, data.spec
    return ObsEncoder(stream_inputs(data), model_latitude(spec), model_longitude(spec), n_static=data.n_static,
                      n_out=len(spec.inputs), hidden=e.hidden, latent=e.latent or None, patch_size=e.patch_size,
                      embed_dim=e.embed_dim, depth=e.depth, num_heads=e.num_heads, mlp_ratio=e.mlp_ratio,
                      length_scale_deg=e.length_scale_deg or None, periodic_longitude=spec.periodic_longitude)


def build_decoder(cfg: StageModels, data: E2EData) -> StationDecoder:
    spec = data.spec
    return StationDecoder(len(spec.inputs), len(data.station_variables), model_latitude(spec),
                          model_longitude(spec), hidden=cfg.decoder.hidden,
                          n_features=int(data.station_altitude),
                          length_scale_deg=cfg.decoder.length_scale_deg or None,
                          periodic_longitude=spec.periodic_longitude)


def model_latitude(spec: WindowSpec) -> list[float]:
    """Latitudes of the model grid's rows (padded rows continue the spacing)."""
    return _extend(spec.latitude, spec.fit.pad_rows)


def model_longitude(spec: WindowSpec) -> list[float]:
    return _extend(spec.longitude, spec.fit.pad_cols)


def _extend(c, pad: tuple[int, int]) -> list[float]:
    c = [float(v) for v in c]
    d = c[1] - c[0] if len(c) > 1 else 1.0
    return [c[0] - d * k for k in range(pad[0], 0, -1)] + c + [c[-1] + d * k for k in range(1, pad[1] + 1)]


class Chain(nn.Module):
    """Encoder then one processor step: forward(batch) -> (analysis z0, processor output at lead 1)."""

    def __init__(self, encoder: nn.Module, processor: nn.Module, n_state: int):
        super().__init__()
        self.encoder, self.processor, self.n_state = encoder, processor, n_state

    def forward(self, batch: dict[str, torch.Tensor], generator=None, deny=()) -> tuple[torch.Tensor, torch.Tensor]:
        z0 = self.encoder(obs_of(batch), batch["static"], deny=deny, generator=generator)
        return z0, self.processor(processor_input(z0, batch["x"], self.n_state), generator=generator)


def build_stage_model(cfg: StageModels, data: E2EData) -> nn.Module:
    if cfg.stage == "encoder":
        return build_encoder(cfg, data)
    if cfg.stage == "decoder":
        return build_decoder(cfg, data)
    if cfg.stage == "chain":
        return Chain(build_encoder(cfg, data), build_forecaster(cfg.processor, data.spec), len(data.spec.inputs))
    raise ValueError(f"stage {cfg.stage} has no end-to-end module (the processor trains as jobs/train_sparse.py)")


def stage_identity(cfg: StageModels, data: E2EData, stage: str | None = None) -> dict[str, Any]:
    """What a checkpoint of a stage must agree on to be loaded (model configs, channels, streams)."""
    stage = stage or cfg.stage
    ident: dict[str, Any] = {"stage": stage, "channels": [c.name for c in data.spec.inputs],
                             "constants": list(data.spec.constants)}
    if stage in ("encoder", "chain"):
        ident["encoder"] = to_dict(cfg.encoder)
        ident["streams"] = [f"{s.name}:{s.kind}:{len(s.channels)}" for s in data.obs.streams]
    if stage == "chain":
        ident["processor"] = to_dict(cfg.processor)
    if stage == "decoder":
        ident["decoder"] = to_dict(cfg.decoder)
        ident["station_variables"] = list(data.station_variables)
        ident["station_altitude"] = data.station_altitude
    return ident


def station_channels(data: E2EData) -> list[int]:
    s = next(s for s in data.obs.streams if s.name == data.station_stream)
    return [list(s.channels).index(v) for v in data.station_variables]


ALTITUDE_SCALE_M = 1000.0  # station heights enter the decoder in km


def station_features(data: E2EData, altitude: torch.Tensor | None) -> torch.Tensor | None:
    """The decoder's per-station features (b, N, F): the height in km when the stream has heights."""
    if not data.station_altitude:
        return None
    if altitude is None:
        raise ValueError(f"stream {data.station_stream}: the decoder takes station heights, the batch has none")
    return (altitude / ALTITUDE_SCALE_M)[..., None]


def decode_stations(model: nn.Module, batch: dict[str, torch.Tensor], data: E2EData,
                    state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoder output at the window's station reports, with their normalised values and mask (b, N, V)."""
    s = data.station_stream
    chans = station_channels(data)
    state = batch["x"][:, :len(data.spec.inputs)] if state is None else state
    pred = model(state, batch[f"obs.{s}.coords"], station_features(data, batch.get(f"obs.{s}.altitude")))
    return pred, batch[f"obs.{s}.values"][..., chans], batch[f"obs.{s}.mask"][..., chans]


@dataclass
class StationSet:
    """Fixed stations decoded at every lead of a forecast: positions (S, 2), heights (S,) or None, and the
    station stream's normalisation of the decoder's variables."""

    coords: torch.Tensor
    altitude: torch.Tensor | None
    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def of(cls, data: E2EData, table) -> StationSet:
        """From a table with columns station, latitude, longitude[, altitude] (NaN height = unknown = 0)."""
        s = next(s for s in data.obs.streams if s.name == data.station_stream)
        alt = (torch.tensor(np.nan_to_num(table["altitude"].to_numpy(np.float32))) if data.station_altitude
               else None)
        return cls(torch.tensor(table[["latitude", "longitude"]].to_numpy(np.float32)), alt,
                   torch.tensor([s.mean[v] for v in data.station_variables]),
                   torch.tensor([s.std[v] for v in data.station_variables]))

    def decode(self, decoder: nn.Module, z: torch.Tensor) -> torch.Tensor:
        """Physical station values (rows, S, V) on the CPU for states z (rows, C, h, w)."""
        rows = z.shape[0]
        feats = None
        if self.altitude is not None:  # as station_features: the height in km
            feats = (self.altitude[None].expand(rows, -1).to(z.device) / ALTITUDE_SCALE_M)[..., None]
        out = decoder(z, self.coords[None].expand(rows, -1, -1).to(z.device), feats)
        return out.cpu() * self.std + self.mean


def station_std(data: E2EData, device) -> torch.Tensor:
    s = next(s for s in data.obs.streams if s.name == data.station_stream)
    return torch.tensor([s.std[v] for v in data.station_variables], dtype=torch.float32, device=device)
