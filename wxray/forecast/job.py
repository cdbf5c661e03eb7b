"""The forecast job (`jobs/forecast.py`): a trained checkpoint rolled out from chosen initialisations,
written as `forecast.zarr` (forecast convention, consolidated metadata) and scored per lead beside
persistence where the store has the truth.

    python jobs/forecast.py checkpoint=runs/train_sparse/exp1 inits=2000-03-01/2000-03-31 steps=8
    python jobs/forecast.py checkpoint=<run dir> members=10    # routing draws (or EDM samples) as an ensemble
    python jobs/evaluate.py forecast=<out_dir>/forecast.zarr truth=<store>   # CRPS, spread-skill, ...

`checkpoint` is a training run directory (its newest checkpoint under `ray/`) or one checkpoint directory, on
disk or at a URL (a run's folder under `train.storage`, fetched once: `checkpoints.fetch`). The model and data
configs are the ones the checkpoint was trained with: its meta.json (`model`, `data`), else the run
directory's config.yaml. The store (`store=`) may be another one with the same channels, e.g. a later period
(other channels: a one-line CheckpointError before any work); an init needs only its history in the store, and
inits with truth for every lead are scored. Whatever the store, windows are normalised as in training: with
the vectors meta.json keeps (`normalisation`), or for older checkpoints the training store's statistics. The
run's provenance (provenance.json, summary.json) names the store's fingerprint and the checkpoint's own
provenance.

forecast.zarr is written as it is made, batch by batch (`output.py`: memory is one batch whatever the inits,
members and leads); a stopped run continues where it stopped when the same command is run again, and with
`workers.actors=N` the batches run on N Ray actors all writing the one store (`wxray.platform.ensemble.forecast`).

`members` = M > 1 forecasts every init M times, member m drawing its token selection from a
generator seeded by (seed, init time, m) (rollout.py), so a member can be recomputed alone; M = 1 is
the plain deterministic forecast (member 0, no `member` dim). A generative (model.name=edm) checkpoint
draws member m as a sample of the EDM from that generator (noise, churn and routing; `sampler.*` sets
the sampler), each lead's sample fed back as the next step's history.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import xarray as xr

from wxray.config import InPath, NonNegInt, PosFloat, PosInt, RunsDir, Seed, from_dict
from wxray.config_yaml import load_yaml
from wxray.data import location
from wxray.data.anchors import choose_inits, parse_range, split_anchors, valid_anchors
from wxray.data.schema import TIME, Stats, open_stats, open_store
from wxray.data.window_data import DataConfig
from wxray.data.windows import WindowSpec, fit_spec, make_spec
from wxray.errors import CheckpointError, ConfigError
from wxray.forecast import checkpoints, mlflow_model
from wxray.forecast.forecaster import Runner, auto_batch_size, forecast_and_score, in_process, load_forecaster
from wxray.forecast.rollout import check_rollout, routing_varies
from wxray.forecast.workers import ForecastWorkers
from wxray.job import JobConfig, JobContext, recorded_path
from wxray.models.compiled import CompileMode, compile_forecaster
from wxray.models.registry import ModelConfig, SamplerConfig, channel_signature
from wxray.provenance import store_fingerprint
from wxray.tracking import resolve_uri


@dataclass
class ForecastConfig(JobConfig):
    checkpoint: RunsDir = ""  # a training run directory (its newest checkpoint) or a checkpoint directory, or a URL
    store: InPath = ""  # "" = the store the checkpoint was trained on
    inits: str = ""  # "start/end" init times, inclusive; "" = the training run's test split with truth at every lead
    steps: PosInt = 4  # autoregressive steps, each the checkpoint's lead (data.lead_steps native steps)
    # members per init: routing draws of a routed forecaster, samples of an edm one; > 1 writes a `member` dim
    members: PosInt = 1
    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # edm checkpoints: how a sample is drawn
    seed: Seed = 0  # member m of init t draws from SeedSequence([seed, t in seconds, m]) (rollout.py)
    # (init, member) samples per forward, 0 = from the free memory of a GPU (8 on the CPU); on the CPU any
    # member recomputes alone bit for bit whatever the batch (models/batch_invariance.py), on a GPU only with 1
    batch_size: NonNegInt = 0
    workers: ForecastWorkers = field(default_factory=ForecastWorkers)  # actors=0: in this process; N: Ray actors
    ray_address: str = ""  # workers.actors > 0: "" = RAY_ADDRESS under ray job submit, else a local cluster
    ray_timeout_s: PosFloat = 60.0  # give up on an unreachable ray_address after this many seconds
    device: str = "auto"  # auto (a GPU when there is one), cpu, cuda, cuda:1; must exist on this machine
    # torch.compile the forecaster (an edm one: its denoiser) for the rollout: off, default, reduce-overhead (CUDA
    # graphs), max-autotune; pays on a GPU, where a small forward is bound by kernel launches (models/compiled.py)
    compile: CompileMode = "off"

    experiment = "wxray-forecast"
    renamed = {"routing_members": "members"}  # one release

    def validate(self) -> None:
        if not self.checkpoint:
            raise ConfigError("config key 'checkpoint' is required (a training run directory or a checkpoint "
                              "directory)")
        if self.inits:
            parse_range(self.inits, "inits")
        resolve_device(self.device)  # before the job starts, not at model.to(device)


def find_checkpoint(path: str, tracking_uri: str = "") -> Path:
    """The checkpoint directory `checkpoint=` names (for a URL, its local copy: `checkpoints.fetch`; for an
    MLflow model URI, models:/<name>/<version>, the model's checkpoint from the registry of `tracking_uri`)."""
    if mlflow_model.is_model_uri(path):
        return mlflow_model.fetch_model(path, tracking_uri or resolve_uri())
    if location.is_remote(path):
        return checkpoints.fetch(_find_remote(str(path).rstrip("/")))
    p = Path(path).expanduser()
    if p.is_file() and p.name == checkpoints.STATE:
        p = p.parent
    if not p.is_dir():
        raise CheckpointError(f"checkpoint {p} does not exist (expected a training run directory or a checkpoint "
                              "directory)")
    if (p / checkpoints.STATE).is_file():
        return p
    last = checkpoints.latest(p / "ray" if (p / "ray").is_dir() else p)
    if last is None:
        raise CheckpointError(f"checkpoint {p}: no checkpoint found (expected a training run directory with "
                              f"ray/**/checkpoint_*/ or a checkpoint directory with {checkpoints.STATE})")
    return last


def _find_remote(url: str) -> str:
    if url.endswith("/" + checkpoints.STATE):
        url = url.rsplit("/", 1)[0]
    if not location.reachable(url, "checkpoint"):
        raise CheckpointError(f"checkpoint {url} does not exist (expected a training run's folder or a checkpoint "
                              "directory)")
    if location.exists(location.join(url, checkpoints.STATE)):
        return url
    ray = location.join(url, "ray")
    last = checkpoints.latest(ray if location.exists(ray) else url)
    if last is None:
        raise CheckpointError(f"checkpoint {url}: no checkpoint found (expected a training run's folder with "
                              f"ray/**/checkpoint_*/ or a checkpoint directory with {checkpoints.STATE})")
    return str(last)


def _run_config(ckpt: Path) -> Path | None:
    """config.yaml of the training run directory holding `ckpt` under its ray/ storage."""
    for parent in ckpt.parents:
        if (parent / "config.yaml").is_file() and (parent / "ray") in (ckpt, *ckpt.parents):
            return parent / "config.yaml"
    return None


def training_configs(ckpt: Path, meta: dict[str, Any]) -> tuple[ModelConfig, DataConfig]:
    names = {f.name for f in fields(ModelConfig)}
    model = {k: v for k, v in checkpoints.meta_model(meta).items() if k in names}
    data = meta.get("data")
    if data is None:  # checkpoints written before meta.json held the data config
        found = _run_config(ckpt)
        if found is None:
            raise CheckpointError(f"checkpoint {ckpt}: meta.json has no data config and no training run "
                                  "config.yaml was found above it")
        data = load_yaml(found).get("data", {})
    try:
        return from_dict(ModelConfig, model, saved=True), from_dict(DataConfig, data, saved=True)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {ckpt}: its training config does not load here ({e})") from None


def _placeholder_stats(ds: xr.Dataset) -> Stats:
    """Mean 0 and std 1 for every variable of `ds`: `make_spec`'s channels and grid without reading the
    store's statistics, for a spec whose normalisation is then replaced by the checkpoint's."""
    zero, one = (xr.Dataset({v: ((), value) for v in ds.data_vars}) for value in (0.0, 1.0))
    return Stats(mean=zero, std=one, diff_mean=zero, diff_std=one, climatology=None)


def check_channels(ckpt: Path, meta: dict[str, Any], spec: WindowSpec) -> None:
    """CheckpointError unless the store of `spec` gives the channels (variables, levels, constants) the
    checkpoint was trained on, in its order; checkpoints that do not record them are checked by their weights."""
    theirs = checkpoints.meta_model(meta).get("channels")
    ours = channel_signature(spec)
    if theirs is None or theirs == ours:
        return
    missing = list(dict.fromkeys(c for c in theirs if c not in ours))  # inputs and targets share names
    extra = list(dict.fromkeys(c for c in ours if c not in theirs))
    what = "; ".join(f"{k} {v}" for k, v in (("missing", missing), ("not trained on", extra)) if v) or \
        f"in another order or role ({' '.join(ours)}; trained on {' '.join(theirs)})"
    raise CheckpointError(f"store {spec.store} does not have the channels checkpoint {ckpt} was trained on: {what} "
                          "(forecast from a store with the training variables, levels and constants)")


def trained_spec(ckpt: Path, meta: dict[str, Any], store: str, ds: xr.Dataset, model_cfg: ModelConfig,
                 data_cfg: DataConfig) -> WindowSpec:
    """The windows of `store` normalised as the checkpoint was trained, whatever store is forecast: the
    vectors meta.json keeps, else (older checkpoints) the statistics of the training store `data.store`.
    The store's channels must be the checkpoint's (`check_channels`)."""
    spec = make_spec(store, ds, _placeholder_stats(ds), data_cfg)
    check_channels(ckpt, meta, spec)
    trained = checkpoints.apply_normalisation(spec, meta, ckpt)
    if trained is None:  # written before meta.json kept the normalisation
        train_store = Path(recorded_path(data_cfg.store, "the checkpoint's training store"))
        if not train_store.exists():
            raise CheckpointError(f"checkpoint {ckpt}: its {checkpoints.META} predates the saved normalisation and "
                                  f"its training store data.store={train_store} is gone (its stats/ are needed "
                                  "to normalise as in training)")
        trained = make_spec(store, ds, open_stats(train_store), data_cfg)
    return fit_spec(trained, model_cfg.patch_size, data_cfg.grid_fit)


def resolve_device(name: str) -> torch.device:
    """The torch device of config key `device`, one this machine has: auto is cuda when there is one, else
    cpu; cuda and cuda:<i> need that CUDA (or ROCm) device. Anything else is a ConfigError naming the key."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    expects = f"config key 'device' expects auto, cpu, cuda or cuda:<i>, got {name!r}"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(expects) from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(expects)
    if device.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ConfigError(f"config key 'device' is {name!r} but this machine has no CUDA device "
                              "(use device=cpu or device=auto)")
        if device.index is not None and device.index >= n:
            raise ConfigError(f"config key 'device' is {name!r} but this machine has {n} CUDA device(s), "
                              f"cuda:0 to cuda:{n - 1}")
    return device


def forecast(cfg: ForecastConfig, ctx: JobContext, runner: Runner = in_process) -> dict[str, Any]:
    """The job; `runner` runs the batches (`wxray.platform.ensemble.forecast` passes Ray actors' when
    workers.actors > 0)."""
    ckpt = find_checkpoint(cfg.checkpoint, cfg.tracking.uri)
    meta = checkpoints.read_meta(ckpt)
    model_cfg, data_cfg = training_configs(ckpt, meta)
    # cfg.store is absolute already; the training store as it is here (a URL stays one; a moved project's
    # store under the wxray home), recorded in config.yaml as the store used
    store = cfg.store
    if not store:
        store = recorded_path(data_cfg.store, "the checkpoint's training store")
        data_cfg = replace(data_cfg, store=store)
        ctx.record_resolved({"store": store})
    ds = open_store(store)
    spec = trained_spec(ckpt, meta, store, ds, model_cfg, data_cfg)
    model = load_forecaster(ckpt, model_cfg, spec, cfg.sampler)
    try:
        check_rollout(spec, cfg.steps)
    except ValueError as e:
        raise ConfigError(f"checkpoint {ckpt}: {e}") from None
    if cfg.members > 1 and not (model_cfg.generative or routing_varies(model)):
        raise ConfigError(f"members={cfg.members}: the checkpoint's model.selection="
                          f"{model_cfg.selection} (deterministic_eval={model_cfg.deterministic_eval}) draws no "
                          "random routing, so every member would be the same")
    test = split_anchors(ds, valid_anchors(ds, spec.history, spec.lead_steps), data_cfg)["test"]
    anchors = choose_inits(ds, spec, test, cfg.inits, cfg.steps, store)
    device = resolve_device(cfg.device)
    ctx.provenance["store"] = store_fingerprint(store, ds)
    where = checkpoints.origin(ckpt)  # the URL or model URI of a fetched checkpoint
    ctx.provenance["checkpoint"] = {"path": where, **checkpoints.meta_provenance(meta)}
    tracker = ctx.tracker  # every input is checked: the run starts here

    members = list(range(cfg.members)) if cfg.members > 1 else None
    model = compile_forecaster(model.to(device), cfg.compile, device)
    batch_size = cfg.batch_size or auto_batch_size(model, spec, anchors[:1], device)
    run = forecast_and_score(model, spec, ds, anchors, cfg.steps, ctx.out_dir, tracker, seed=cfg.seed,
                             batch_size=batch_size, members=members, device=device, runner=runner,
                             attrs={"checkpoint": where, "seed": cfg.seed, "store": store},
                             on_written=lambda: setattr(ctx, "keep_on_failure", True))  # a re-run continues
    times = ds[TIME].values[anchors]
    return {"forecast": str(run.path), "checkpoint": where, "store": store, "inits": int(len(anchors)),
            "first_init": str(times[0])[:19], "last_init": str(times[-1])[:19], "members": cfg.members,
            "grid_fit": spec.fit.mode, "grid": f"{spec.kept_grid[0]}x{spec.kept_grid[1]}", "batch_size": batch_size,
            "rollout": {"scored_inits": int(len(run.scored)), **run.report}}
