"""What the one training loop (`loop.py`) trains: a task is a module, its loss on a batch and its validation.

    class Task:
        spec                      the windows' spec: the kept grid's latitudes weight every loss
        label                     prefix of the console's epoch lines ("" for the forecaster)
        build() -> module         weights initialised (the loop seeds torch first) or loaded from earlier runs
        loss(model, batch, lat_w, generator) -> (loss, auxiliary loss or None)
        validate(model, batches, lat_w, device, world, dtype, dummy, final) -> {"val/loss": ..., ...}
        shard_units(model)        the modules FSDP2 shards one by one (the transformer blocks)

Every task gets all the loop has (resume, elastic sizes, fault drill, compile, memory metrics, a sweep's early
stop, exactly-once shards in lockstep). `ForecasterTask` is the forecaster and the EDM (`jobs/train_sparse.py`,
the end-to-end processor stage); the end-to-end stages are `stages.StageTask`, the stochastic finetunes
`stochastic.EncoderTask` / `ProcessorTask`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from wxray.data.windows import WindowSpec, to_physical
from wxray.forecast import checkpoints
from wxray.models import edm_loss, lat_weighted_mse, selector_loss
from wxray.models.blocks import Block
from wxray.models.edm_blocks import EDMBlock
from wxray.models.registry import ModelConfig, SamplerConfig, as_forecaster, build_forecaster
from wxray.platform.cluster import devices
from wxray.platform.train.batches import lockstep_batches
from wxray.verify.metrics import RMSE

TRANSFORMER_BLOCKS = (Block, EDMBlock)
# Validation's per-channel RMSE is the scorecard's (`verify.metrics.RMSE`): reported as VAL_RMSE + channel,
# aggregated by its `from_means` from the workers' summed per-window MSE (the torch accumulation stays here).
VALIDATION_RMSE = RMSE()
VAL_RMSE = f"val/{RMSE.name}/"


class Task(ABC):
    """The protocol of the module docstring; a subclass defines build, loss and validate."""

    spec: WindowSpec
    label: str = ""
    aux_weight: float = 0.0  # weight of `loss`'s auxiliary term in the backward pass

    @abstractmethod
    def build(self) -> nn.Module: ...

    @abstractmethod
    def loss(self, model: nn.Module, batch: dict, lat_w: torch.Tensor,
             generator) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    @abstractmethod
    def validate(self, model: nn.Module, batches: Iterable[dict], lat_w: torch.Tensor, device, world: int, dtype,
                 dummy: dict, final: bool) -> dict[str, float]: ...

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.modules() if isinstance(m, TRANSFORMER_BLOCKS)]


def training_loss(model: nn.Module, cfg: ModelConfig, spec: WindowSpec, batch: dict, lat_w: torch.Tensor,
                  var_w: torch.Tensor | None, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, auxiliary loss or None) of one batch: Eq. 3's latitude-weighted MSE of the forecast, or for a
    generative model Eq. 6's EDM loss at noise levels drawn from `generator`; both on the kept grid."""
    x, y = batch["x"], batch["y"]
    if cfg.generative:
        return edm_loss(model, y, x, lat_w, generator, cfg.p_mean, cfg.p_std, var_w, crop=spec.unpad), None
    pred = model(x, generator=generator).float()
    loss = lat_weighted_mse(spec.unpad(pred), spec.unpad(y), lat_w, var_w)
    # None unless selection=learned; on the model grid, padded rows weighted 0
    return loss, selector_loss(model, pred, y, spec.row_weights(lat_w))


def validate(model, batches, spec: WindowSpec, lat_w: torch.Tensor, device, world: int, dtype,
             seed: int, dummy: dict, model_cfg: ModelConfig | None = None, sampler: SamplerConfig | None = None,
             final: bool = True) -> dict[str, float]:
    """Normalised loss and latitude-weighted RMSE per target channel in physical units.

    A generative model: the loss is the EDM loss (same noise levels every epoch); the RMSE, that of one
    sample per window drawn with `sampler`, costs 2 x sampler.steps - 1 forwards, so only the `final`
    validation computes it.
    """
    model_cfg, sampler = model_cfg or ModelConfig(), sampler or SamplerConfig()  # default: a deterministic model
    model.eval()
    forecaster = as_forecaster(model, model_cfg, sampler)
    score = final or not model_cfg.generative
    gen = torch.Generator().manual_seed(seed + 7919)  # validation draws the same tokens every epoch
    loss_gen = torch.Generator().manual_seed(seed + 7920)
    n_out = len(spec.targets)
    sums = torch.zeros(n_out + 2, dtype=torch.float64, device=device)  # per-channel SE, loss, count
    with torch.no_grad():
        for batch, w, _ in lockstep_batches(batches, dummy, device, world):
            w = float(w > 0)  # sums over real windows only
            x, y = batch["x"], batch["y"]
            with devices.compute(device, dtype):
                pred = forecaster(x, generator=gen).float() if score else None
                if model_cfg.generative:
                    loss = training_loss(model, model_cfg, spec, batch, lat_w, None, loss_gen)[0]
                else:
                    loss = lat_weighted_mse(spec.unpad(pred), spec.unpad(y), lat_w)
            if score:  # padded rows/columns (data.grid_fit=pad) are not data: scores and loss on the kept grid
                phys_p, phys_t = spec.unpad(to_physical(spec, pred, x)), spec.unpad(to_physical(spec, y, x))
                se = ((phys_p - phys_t) ** 2 * lat_w[None, None, :, None]).mean(dim=(-2, -1))  # (b, V)
                sums[:n_out] += w * se.sum(0).double()
            sums[n_out] += w * loss.double() * x.shape[0]
            sums[n_out + 1] += w * x.shape[0]
    if world > 1:
        dist.all_reduce(sums)
    count = max(1.0, sums[-1].item())
    out = {"val/loss": sums[n_out].item() / count, "val/windows": count}
    for i, ch in enumerate(spec.targets):
        if score:
            out[VAL_RMSE + ch.name] = float(VALIDATION_RMSE.from_means(sums[i].item() / count))
    model.train()
    return out


@dataclass
class ForecasterTask(Task):
    """The forecaster of `model` on `spec`: Eq. 3's loss (Eq. 6's for a generative model), optionally started
    from the weights of `init_from` (checked on the driver against the model's identity)."""

    model: ModelConfig
    spec: WindowSpec
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    var_weights: dict[str, float] = field(default_factory=dict)
    init_from: str = ""
    activation_checkpointing: bool = False
    seed: int = 0
    label: str = ""

    @property
    def aux_weight(self) -> float:
        return self.model.selector_loss_weight

    def build(self) -> nn.Module:
        model = build_forecaster(self.model, self.spec)
        model.activation_checkpointing = self.activation_checkpointing
        if self.init_from:
            checkpoints.load_model_weights(model, checkpoints.load(self.init_from)[0], self.init_from)
        return model

    def loss(self, model, batch, lat_w, generator):
        # made once per device: a host-to-device copy inside the step would stop its CUDA-graph capture
        if getattr(self, "_var_w", None) is None or self._var_w.device != lat_w.device:
            self._var_w = torch.tensor([self.var_weights.get(c.name, 1.0) for c in self.spec.targets],
                                       device=lat_w.device)
        return training_loss(model, self.model, self.spec, batch, lat_w, self._var_w, generator)

    def validate(self, model, batches, lat_w, device, world, dtype, dummy, final):
        return validate(model, batches, self.spec, lat_w, device, world, dtype, self.seed, dummy, self.model,
                        self.sampler, final=final)
