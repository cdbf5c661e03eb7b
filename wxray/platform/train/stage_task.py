"""The deterministic end-to-end stages as tasks of the one loop: what each Ray Train stage optimises.

The chain's loss is latitude-weighted MSE in normalised-state units (`forecast/state.py`): of the lead-1 state
reached from the encoder's analysis against the true state at t+1, plus `analysis_weight` times that of the
analysis against the true state at t. Without the second term the lead-1 objective is free to move z0 anywhere
the processor can correct in one step, and the analysis stops being one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from wxray.data.e2e_windows import E2EData
from wxray.forecast import checkpoints
from wxray.forecast.stages import build_stage_model, decode_stations, station_std
from wxray.forecast.state import next_state, obs_of
from wxray.models import lat_weighted_mse
from wxray.platform.cluster import devices
from wxray.platform.train.batches import lockstep_batches
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.platform.train.tasks import VAL_RMSE, VALIDATION_RMSE, Task


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
            mse = sums[i].item() / max(1.0, sums[len(names) + i].item())
            out[VAL_RMSE + name] = float(VALIDATION_RMSE.from_means(mse))
        model.train()
        return out
