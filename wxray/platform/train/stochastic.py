"""`jobs/finetune_stochastic.py`: the stochastic uplift of a trained end-to-end chain (the paper's Methods).

    stage=encoder    warm-started from the deterministic encoder (the chain's, else the encoder stage's), its
                     ViT conditioned on a per-patch noise draw (`stochastic.noise`: film | embed); fair CRPS over
                     M = `stochastic.members` draws against the true state at t
    stage=processor  the deterministic processor with dropout p (`stochastic.dropout`) active, on the stochastic
                     encoder's analyses (one draw per sample), fair CRPS over N = `stochastic.members` dropout
                     members, sequentially per lead 1 .. `stochastic.leads`: lead k starts from lead k-1's weights
                     and is trained on its own rollout (steps 1 .. k-1 without gradient, step k with it)

Members are a batch dimension: one forward over (batch x M) rows, each sample's members contiguous and on one
rank (a sample is never split across Train workers), so the CRPS compares the members of one sample. Losses
are in normalised-state units, latitude-weighted. The data, encoder and processor configs are those the
deterministic stages were trained with (their config.yaml); outputs go beside them:
`<stages>/stochastic_encoder`, `<stages>/stochastic_processor/lead_<k>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from wxray.config import Fraction, NonNegInt, PosInt, Probability, Range, RunsDir, to_dict
from wxray.console import say
from wxray.data.e2e_windows import E2EData, prepare_e2e
from wxray.errors import CheckpointError, ConfigError
from wxray.forecast import checkpoints, mlflow_model
from wxray.forecast.stages import build_encoder, trained_stage
from wxray.forecast.state import next_state, obs_of, processor_input
from wxray.job import JobConfig, JobContext
from wxray.models import StochasticEncoder, fair_crps_loss, set_dropout, split_members, tile_members
from wxray.models.blocks import uniform
from wxray.models.registry import build_forecaster
from wxray.platform.cluster.scaling import ScalingCfg
from wxray.platform.train.batches import lockstep_batches
from wxray.platform.train.config import LoopConfig, OptimConfig
from wxray.platform.train.e2e import fit_stage
from wxray.platform.train.stage_config import TrainE2EConfig, check_stages_folder
from wxray.platform.train.stage_task import StageTask


@dataclass
class StochasticCfg:
    noise: Literal["film", "embed"] = "film"  # noise into the encoder: FiLM norms at every block | once at the tokens
    noise_dim: PosInt = 32  # width of the per-patch noise draw a
    members: Annotated[int, Range(2)] = 4  # M (encoder) or N (processor) members per sample in the fair CRPS
    dropout: Annotated[float, Range(0, 1, hi_open=True)] = 0.05  # processor dropout p, kept on at inference
    alpha: Fraction = 1.0  # 1 = fair CRPS; < 1 blends in the standard ensemble CRPS ("almost fair")
    leads: PosInt = 2  # processor: finetune leads 1 .. leads one after the other
    lead_epochs: NonNegInt = 0  # processor: epochs per lead after the first; 0 = train.epochs
    deny_prob: Probability = 0.0  # encoder: each stream withheld from a training sample with this probability


@dataclass
class FinetuneStochasticConfig(JobConfig):
    stage: Literal["encoder", "processor"] = "encoder"  # which branch to finetune (processor needs encoder first)
    stages: RunsDir = ""  # the deterministic chain (jobs/train_e2e.py); "" = runs/train_e2e/<run_name or e2e>
    stochastic: StochasticCfg = field(default_factory=StochasticCfg)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-4, weight_decay=1e-5, warmup_steps=5,
                                                                   min_lr_ratio=0.01))
    train: LoopConfig = field(default_factory=lambda: LoopConfig(epochs=4))
    scaling: ScalingCfg = field(default_factory=ScalingCfg)
    ray_address: str = ""  # Ray cluster (host:port); "" = RAY_ADDRESS (ray job submit) or a new local one
    ray_timeout_s: Annotated[float, Range(0, lo_open=True)] = 60.0  # give up on an unreachable ray_address after
    # once both branches are uplifted, the stages folder is logged as the run's MLflow model (mlflow_model.py)
    registered_model: str = "wxray-e2e"  # the registered model it becomes the next version of
    register_model: bool = True  # false: the model is logged to the run, no version registered

    experiment = "wxray-e2e"
    columns = ("val/loss", "train/epoch_loss")
    renamed = {"stages_dir": "stages"}  # one release

    def run_label(self, job: str) -> str:
        return f"stochastic-{self.stage}-{self.stochastic.noise}"

    def validate(self) -> None:
        check_stages_folder(self.train.storage, self.stages)  # the deterministic stages are under it
        if not self.stages:
            self.stages = f"runs/train_e2e/{self.run_name or 'e2e'}"
        if not self.out_dir:
            self.out_dir = f"{self.stages}/stochastic_{self.stage}"


@dataclass
class StochasticRun(TrainE2EConfig):
    """What a worker of a stochastic stage needs: the deterministic chain's configs plus the finetune's."""

    stochastic: StochasticCfg = field(default_factory=StochasticCfg)
    lead: PosInt = 1  # the processor lead being finetuned


def deterministic_config(stages: Path) -> tuple[TrainE2EConfig, str]:
    """The chain's (else the encoder stage's) training config and which stage it is."""
    for name in ("chain", "encoder"):
        found = trained_stage(stages, name, TrainE2EConfig)
        if found is not None:
            return found[1], name
    raise CheckpointError(f"stages {stages}: no trained chain or encoder stage to uplift (run jobs/train_e2e.py "
                          "stage=encoder, processor, decoder, chain first)")


def load_encoder(run: StochasticRun, data: E2EData, stages: Path, det: str) -> StochasticEncoder:
    """The deterministic encoder's weights inside a fresh StochasticEncoder (noise MLP and FiLM at zero)."""
    ckpt = checkpoints.latest(stages / det / "ray")
    state, _ = checkpoints.load(ckpt)
    weights = checkpoints.part(state, "encoder.") if det == "chain" else state["model"]
    encoder = build_encoder(run, data)
    encoder.load_state_dict(weights)
    return StochasticEncoder(encoder, noise=run.stochastic.noise, noise_dim=run.stochastic.noise_dim)


def load_processor(run: StochasticRun, data: E2EData, stages: Path, det: str) -> nn.Module:
    ckpt = checkpoints.latest(stages / det / "ray") if det == "chain" else checkpoints.latest(
        stages / "processor" / "ray")
    if ckpt is None:
        raise CheckpointError(f"stages {stages}: no processor stage to uplift (run jobs/train_e2e.py stage=processor)")
    state, _ = checkpoints.load(ckpt)
    weights = checkpoints.part(state, "processor.") if det == "chain" else state["model"]
    proc = build_forecaster(replace(run.processor, dropout=run.stochastic.dropout), data.spec)
    proc.load_state_dict(weights)
    return proc


def random_keep(batch: int, n_streams: int, deny_prob: float, generator, device) -> torch.Tensor:
    """(batch, n_streams) 0/1: each stream withheld from each sample with probability `deny_prob`, never all of a
    sample's streams. Training the noise on such samples is what lets the encoder's spread grow when a stream is
    missing at inference (an observing-system denial); trained with every stream present it has no reason to."""
    u = uniform((batch, n_streams), generator, device)
    keep = (u >= deny_prob).float()
    empty = keep.sum(1) == 0
    keep[empty, u[empty].argmax(1)] = 1.0  # the stream with the largest draw stays
    return keep


class EncoderTask(StageTask):
    """The noise-conditioned encoder finetuned on the fair CRPS over M members (module docstring)."""

    def __init__(self, cfg: StochasticRun, data: E2EData, stages: str, det: str, label: str = "stochastic encoder"):
        super().__init__(cfg, data, label=label)
        self.stages, self.det = Path(stages), det

    def build(self):
        return load_encoder(self.cfg, self.data, self.stages, self.det)

    def ensemble(self, model, batch, generator):
        cfg = self.cfg
        keep = None
        if model.training and cfg.stochastic.deny_prob > 0:
            streams = getattr(model, "module", model).encoder.streams  # DDP wraps the model
            keep = random_keep(batch["static"].shape[0], len(streams), cfg.stochastic.deny_prob,
                               generator, batch["static"].device)
        return split_members(model(obs_of(batch), batch["static"], members=cfg.stochastic.members,
                                   noise_generator=generator, keep=keep), cfg.stochastic.members)

    def truth(self, batch):
        return batch["x"][:, :len(self.data.spec.inputs)]

    def loss(self, model, batch, lat_w, generator):
        ens = self.ensemble(model, batch, generator).float()
        spec = self.data.spec
        return fair_crps_loss(spec.unpad(ens), spec.unpad(self.truth(batch)), 1, lat_w,
                              alpha=self.cfg.stochastic.alpha), None

    @torch.no_grad()
    def validate(self, model, batches, lat_w, device, world, dtype, dummy, final) -> dict:
        """Fair CRPS (the loss), ensemble-mean RMSE and spread per channel, normalised units."""
        model.eval()
        spec = self.data.spec
        n = len(spec.inputs)
        sums = torch.zeros(2 * n + 2, dtype=torch.float64, device=device)
        gen = torch.Generator().manual_seed(self.cfg.train.seed + 7919)
        w_lat = lat_w[None, None, :, None]
        for batch, w, _ in lockstep_batches(batches, dummy, device, world):
            w = float(w > 0)
            ens = spec.unpad(self.ensemble(model, batch, gen).float())
            truth = spec.unpad(self.truth(batch))
            sums[-2] += w * fair_crps_loss(ens, truth, 1, lat_w, alpha=self.cfg.stochastic.alpha).double() * len(truth)
            sums[:n] += w * (((ens.mean(1) - truth) ** 2) * w_lat).mean(dim=(-2, -1)).sum(0).double()
            sums[n:2 * n] += w * (ens.var(1) * w_lat).mean(dim=(-2, -1)).sum(0).double()
            sums[-1] += w * len(truth)
        if world > 1:
            dist.all_reduce(sums)
        count = max(1.0, sums[-1].item())
        out = {"val/loss": sums[-2].item() / count, "val/windows": count}
        for i, ch in enumerate(spec.inputs):
            out[f"val/ens_mean_rmse_norm/{ch.name}"] = (sums[i].item() / count) ** 0.5
            out[f"val/spread_norm/{ch.name}"] = (sums[n + i].item() / count) ** 0.5
        model.train()
        return out


class ProcessorModel(nn.Module):
    """The frozen stochastic encoder and the processor being finetuned (dropout on)."""

    def __init__(self, encoder: StochasticEncoder, processor: nn.Module, n_state: int):
        super().__init__()
        self.encoder, self.processor, self.n_state = encoder.requires_grad_(False), processor, n_state

    def train(self, mode: bool = True):
        super().train(mode)
        self.encoder.eval()  # the analyses come from the finetuned encoder as it is
        return self


class ProcessorTask(EncoderTask):
    """The MC-dropout processor finetuned at lead k on the fair CRPS over N members. `step_spec` is the
    processor's own (lead-1) normalisation; the data of lead k read the truth at t+k. `init`: lead k-1's
    checkpoint ("" at lead 1: the deterministic processor)."""

    def __init__(self, cfg: StochasticRun, data: E2EData, stages: str, det: str, step_spec, init: str = "",
                 label: str = ""):
        super().__init__(cfg, data, stages, det, label=label or f"stochastic processor lead {cfg.lead}")
        self.step_spec, self.init_from = step_spec, init

    def build(self):
        cfg, data = self.cfg, self.data
        step_data = replace(data, windows=replace(data.windows, spec=self.step_spec))
        enc_ckpt = checkpoints.latest(self.stages / "stochastic_encoder" / "ray")
        encoder = load_encoder(cfg, step_data, self.stages, self.det)
        checkpoints.load_model_weights(encoder, checkpoints.load(enc_ckpt)[0], str(enc_ckpt))
        proc = load_processor(cfg, step_data, self.stages, self.det)
        if self.init_from:  # lead k starts from lead k-1
            weights = checkpoints.part(checkpoints.load(self.init_from)[0], "processor.")
            checkpoints.load_model_weights(proc, {"model": weights}, self.init_from)
        set_dropout(proc, cfg.stochastic.dropout)
        return ProcessorModel(encoder, proc, len(data.spec.inputs))

    def ensemble(self, model, batch, generator):
        """Lead-k states of N dropout members from one analysis draw per sample: (b, N, V, h, w)."""
        cfg = self.cfg
        n, members = model.n_state, cfg.stochastic.members
        with torch.no_grad():
            z0 = model.encoder(obs_of(batch), batch["static"], noise_generator=generator)
        z, x = tile_members(z0, members), tile_members(batch["x"], members)
        for k in range(cfg.lead):  # the rollout to lead k-1 is data; only the last step learns
            with torch.set_grad_enabled(torch.is_grad_enabled() and k == cfg.lead - 1):
                z = next_state(self.step_spec, z, model.processor(processor_input(z, x, n), generator=generator))
        return split_members(z, members)

    def truth(self, batch):
        return next_state(self.data.spec, batch["x"][:, :len(self.data.spec.inputs)], batch["y"])


def stochastic_identity(run: StochasticRun, data: E2EData, stage: str) -> dict[str, Any]:
    ident = {"stage": f"stochastic_{stage}", "encoder": to_dict(run.encoder), "noise": run.stochastic.noise,
             "noise_dim": run.stochastic.noise_dim, "channels": [c.name for c in data.spec.inputs],
             "streams": [f"{s.name}:{s.kind}:{len(s.channels)}" for s in data.obs.streams]}
    if stage == "processor":
        ident["processor"] = to_dict(replace(run.processor, dropout=run.stochastic.dropout))
    return ident


def finetune_stochastic(cfg: FinetuneStochasticConfig, ctx: JobContext) -> dict[str, Any]:
    stages = Path(cfg.stages)
    det_cfg, det = deterministic_config(stages)
    run = StochasticRun(**{k: v for k, v in vars(det_cfg).items()}, stochastic=cfg.stochastic)
    run = replace(run, stage=det, optim=cfg.optim, train=cfg.train, scaling=cfg.scaling, ray_address=cfg.ray_address,
                  ray_timeout_s=cfg.ray_timeout_s, out_dir=cfg.out_dir, tracking=cfg.tracking)
    data = prepare_e2e(run.data, run.encoder.patch_size)
    if cfg.stage == "encoder":
        task = EncoderTask(run, data, str(stages), det)
        try:
            task.build()
        except ValueError as e:
            raise ConfigError(f"stochastic.noise={cfg.stochastic.noise}: {e}") from None
        result, metrics = fit_stage(run, data, ctx, stochastic_identity(run, data, "encoder"), task)
        return {**_summary(result, metrics, det, data), **register(cfg, ctx, stages)}
    if checkpoints.latest(stages / "stochastic_encoder" / "ray") is None:
        raise CheckpointError(f"stage processor is trained on the stochastic encoder's analyses: none under "
                              f"{stages / 'stochastic_encoder'} (run jobs/finetune_stochastic.py stage=encoder)")
    last = prepare_e2e(replace(run.data, lead_steps=cfg.stochastic.leads), run.encoder.patch_size)
    if len(data.windows.anchors["train"]) and not len(last.windows.anchors["train"]):
        # checked before lead 1 trains: the late leads would otherwise finetune on nothing
        raise ConfigError(f"config key 'stochastic.leads'={cfg.stochastic.leads}: at lead {cfg.stochastic.leads} the "
                          f"train split of store {last.spec.store} holds no windows (the store is too short for that "
                          "many leads); use fewer leads")
    prev, out = "", {}
    for lead in range(1, cfg.stochastic.leads + 1):
        epochs = cfg.train.epochs if lead == 1 or not cfg.stochastic.lead_epochs else cfg.stochastic.lead_epochs
        run_k = replace(run, lead=lead, data=replace(run.data, lead_steps=lead),
                        train=replace(run.train, epochs=epochs))
        data_k = prepare_e2e(run_k.data, run.encoder.patch_size)
        empty = [k for k in ("val", "test") if len(data.windows.anchors[k]) and not len(data_k.windows.anchors[k])]
        if empty:
            say(f"warning: processor lead {lead}: the {' and '.join(empty)} split(s) hold no windows at this lead "
                "(the store is too short): no scores of it")
        say(f"processor lead {lead}/{cfg.stochastic.leads}: {cfg.stochastic.members} dropout members, p="
            f"{cfg.stochastic.dropout:g}")
        task = ProcessorTask(run_k, data_k, str(stages), det, data.spec, prev)
        result, metrics = fit_stage(run_k, data_k, ctx, {**stochastic_identity(run, data, "processor"), "lead": lead},
                                    task, out_dir=Path(cfg.out_dir) / f"lead_{lead}")
        prev = str(Path(result.checkpoint.path).resolve())
        out[f"lead_{lead}"] = _summary(result, metrics, det, data_k)
    return {"leads": out, "checkpoint": prev, "from": det, **register(cfg, ctx, stages)}


def register(cfg: FinetuneStochasticConfig, ctx: JobContext, stages: Path) -> dict[str, Any]:
    """The uplifted stages folder as the run's MLflow model, once it holds both stochastic branches."""
    leads = sorted((stages / "stochastic_processor").glob("lead_*"), key=lambda p: int(p.name.split("_")[1]))
    encoder = checkpoints.latest(stages / "stochastic_encoder" / "ray")
    processor = checkpoints.latest(leads[-1] / "ray") if leads else None
    if not (ctx.tracker.enabled and encoder is not None and processor is not None):
        return {}
    name = cfg.registered_model if cfg.register_model else ""
    config = (Path(ctx.out_dir) / "config.yaml").read_text()
    block = mlflow_model.log_model(ctx.tracker, name, "e2e", config, stages=stages)
    if "uri" in block:
        say(f"registered the uplifted stages as MLflow model {block['uri']} (ensembles with stages={block['uri']})")
    return {"mlflow_model": block}


def _summary(result, metrics: dict, det: str, data: E2EData) -> dict[str, Any]:
    return {"from": det, "val_loss": metrics.get("val/loss"), "train_loss": metrics.get("train/epoch_loss"),
            "epochs": int(metrics.get("epoch", 0)), "n_parameters": metrics.get("n_parameters"),
            "val_ens_mean_rmse_norm": {k.split("/")[-1]: float(f"{v:.6g}") for k, v in metrics.items()
                                       if k.startswith("val/ens_mean_rmse_norm/")},
            "val_spread_norm": {k.split("/")[-1]: float(f"{v:.6g}") for k, v in metrics.items()
                                if k.startswith("val/spread_norm/")},
            "checkpoint": str(Path(result.checkpoint.path).resolve()), "windows": data.counts()}
