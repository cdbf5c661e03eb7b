"""The end-to-end stages as modules and losses: what each Ray Train stage optimises.

Units: the state is normalised per channel by the store statistics (`WindowSpec.in_mean/in_std`), the
processor predicts the normalised tendency (`out_mean/out_std`), station values are normalised by the
station stream's statistics (obs.yaml). With z the normalised state and p the processor output,

    z(t+1) = z(t) + (p * out_std + out_mean) / in_std                 (residual processor)

The chain's loss is latitude-weighted MSE in normalised-state units: of the lead-1 state reached from the
encoder's analysis against the true state at t+1, plus `analysis_weight` times that of the analysis
against the true state at t. Without the second term the lead-1 objective is free to move z0 anywhere the
processor can correct in one step, and the analysis stops being one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from wxray.config import to_dict
from wxray.data.e2e_windows import E2EData
from wxray.data.windows import WindowSpec, per_channel
from wxray.models import ObsEncoder, StationDecoder, StreamInput, lat_weighted_mse
from wxray.models.registry import build_forecaster
from wxray.platform.cluster import devices
from wxray.platform.train import checkpoints
from wxray.platform.train.batches import lockstep_batches
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.platform.train.tasks import Task


def stream_inputs(data: E2EData) -> list[StreamInput]:
    out = []
    for s in data.obs.streams:
        grid = {} if s.kind == "point" else {"latitude": tuple(map(float, s.latitude)),
                                             "longitude": tuple(map(float, s.longitude))}
        out.append(StreamInput(name=s.name, kind=s.kind, n_channels=len(s.channels), **grid))
    return out


def build_encoder(cfg: TrainE2EConfig, data: E2EData) -> ObsEncoder:
    e, spec = cfg.encoder, data.spec
    return ObsEncoder(stream_inputs(data), model_latitude(spec), model_longitude(spec), n_static=data.n_static,
                      n_out=len(spec.inputs), hidden=e.hidden, latent=e.latent or None, patch_size=e.patch_size,
                      embed_dim=e.embed_dim, depth=e.depth, num_heads=e.num_heads, mlp_ratio=e.mlp_ratio,
                      length_scale_deg=e.length_scale_deg or None, periodic_longitude=spec.periodic_longitude)


def build_decoder(cfg: TrainE2EConfig, data: E2EData) -> StationDecoder:
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


def build_stage_model(cfg: TrainE2EConfig, data: E2EData) -> nn.Module:
    if cfg.stage == "encoder":
        return build_encoder(cfg, data)
    if cfg.stage == "decoder":
        return build_decoder(cfg, data)
    if cfg.stage == "chain":
        return Chain(build_encoder(cfg, data), build_forecaster(cfg.processor, data.spec), len(data.spec.inputs))
    raise ValueError(f"stage {cfg.stage} has no end-to-end module (the processor trains as jobs/train_sparse.py)")


def stage_identity(cfg: TrainE2EConfig, data: E2EData, stage: str | None = None) -> dict[str, Any]:
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


def obs_of(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k.startswith("obs.")}


def processor_input(z: torch.Tensor, x: torch.Tensor, n_state: int) -> torch.Tensor:
    """The processor's input for state `z`: z then the constant fields of the row's input `x`."""
    return torch.cat([z, x[:, n_state:]], dim=1)


def next_state(spec: WindowSpec, z: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """Normalised state after one processor step from normalised state `z` (see the module docstring)."""
    base = spec.target_in_input
    phys = pred * per_channel(spec.out_std, pred) + per_channel(spec.out_mean, pred)
    in_std, in_mean = per_channel(spec.in_std[base], pred), per_channel(spec.in_mean[base], pred)
    if spec.residual:
        return z[:, base] + phys / in_std
    return (phys - in_mean) / in_std


def station_channels(data: E2EData) -> list[int]:
    s = next(s for s in data.obs.streams if s.name == data.station_stream)
    return [list(s.channels).index(v) for v in data.station_variables]


def stage_loss(cfg: TrainE2EConfig, model: nn.Module, batch: dict[str, torch.Tensor], data: E2EData,
               lat_w: torch.Tensor, generator=None) -> torch.Tensor:
    """The stage's training loss on one batch (normalised units, latitude-weighted on the kept grid)."""
    spec, n = data.spec, len(data.spec.inputs)
    if cfg.stage == "encoder":
        z0 = model(obs_of(batch), batch["static"], generator=generator)
        return lat_weighted_mse(spec.unpad(z0.float()), spec.unpad(batch["x"][:, :n]), lat_w)
    if cfg.stage == "chain":
        z0, pred = model(batch, generator=generator)
        truth1 = next_state(spec, batch["x"][:, :n], batch["y"])
        lead1 = lat_weighted_mse(spec.unpad(next_state(spec, z0.float(), pred.float())), spec.unpad(truth1), lat_w)
        analysis = lat_weighted_mse(spec.unpad(z0.float()), spec.unpad(batch["x"][:, :n]), lat_w)
        return lead1 + cfg.chain_analysis_weight * analysis
    pred, values, mask = decode_stations(model, batch, data)
    return ((pred.float() - values) ** 2 * mask).sum() / mask.sum().clamp_min(1.0)


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


class StageTask(Task):
    """A deterministic end-to-end stage (encoder, decoder, chain) as a task of the one loop; the chain starts
    from the encoder and processor stages' weights (`init`: part -> checkpoint, checked on the driver). The
    stochastic finetunes (stochastic.py) subclass it."""

    def __init__(self, cfg: TrainE2EConfig, data: E2EData, init: dict[str, str] | None = None, label: str = ""):
        self.cfg, self.data, self.init = cfg, data, dict(init or {})
        self.spec = data.spec
        self.label = label or str(cfg.stage)

    def build(self) -> nn.Module:
        model = build_stage_model(self.cfg, self.data)
        for part, path in self.init.items():
            state, _ = checkpoints.load(path)
            getattr(model, part).load_state_dict(state["model"])
        return model

    def loss(self, model, batch, lat_w, generator):
        return stage_loss(self.cfg, model, batch, self.data, lat_w, generator=generator), None

    @torch.no_grad()
    def validate(self, model, batches, lat_w, device, world, dtype, dummy, final) -> dict[str, float]:
        """Normalised loss and RMSE per channel in physical units: of the analysis (encoder), of the lead-1
        forecast (chain), or at the station reports (decoder)."""
        cfg, data = self.cfg, self.data
        model.eval()
        spec = data.spec
        names = data.station_variables if cfg.stage == "decoder" else [c.name for c in spec.inputs]
        sums = torch.zeros(len(names) * 2 + 2, dtype=torch.float64, device=device)  # SE, count; loss, n
        gen = torch.Generator().manual_seed(cfg.train.seed + 7919)
        for batch, w, _ in lockstep_batches(batches, dummy, device, world):
            w = float(w > 0)
            with devices.compute(device, dtype):
                loss = stage_loss(cfg, model, batch, data, lat_w, generator=gen)
                if cfg.stage == "decoder":
                    pred, values, mask = decode_stations(model, batch, data)
                    se = ((pred.float() - values) ** 2 * mask * station_std(data, device) ** 2).sum(dim=(0, 1))
                    cnt = mask.sum(dim=(0, 1))
                else:
                    if cfg.stage == "encoder":
                        z = model(obs_of(batch), batch["static"], generator=gen).float()
                        truth = batch["x"][:, :len(spec.inputs)]
                    else:
                        z0, pred = model(batch, generator=gen)
                        z = next_state(spec, z0.float(), pred.float())
                        truth = next_state(spec, batch["x"][:, :len(spec.inputs)], batch["y"])
                    err = spec.unpad((z - truth) * torch.as_tensor(spec.in_std, device=device)[None, :, None, None])
                    se = (err ** 2 * lat_w[None, None, :, None]).mean(dim=(-2, -1)).sum(0)
                    cnt = torch.full_like(se, float(z.shape[0]))
            sums[: len(names)] += w * se.double()
            sums[len(names): 2 * len(names)] += w * cnt.double()
            sums[-2] += w * loss.double() * batch["x"].shape[0]
            sums[-1] += w * batch["x"].shape[0]
        if world > 1:
            dist.all_reduce(sums)
        out = {"val/loss": sums[-2].item() / max(1.0, sums[-1].item()), "val/windows": sums[-1].item()}
        for i, name in enumerate(names):
            out[f"val/rmse/{name}"] = float(np.sqrt(sums[i].item() / max(1.0, sums[len(names) + i].item())))
        model.train()
        return out


def station_std(data: E2EData, device) -> torch.Tensor:
    s = next(s for s in data.obs.streams if s.name == data.station_stream)
    return torch.tensor([s.std[v] for v in data.station_variables], dtype=torch.float32, device=device)
