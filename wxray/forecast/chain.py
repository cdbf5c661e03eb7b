"""A trained end-to-end chain loaded for inference: its training config, data, encoder, processor and decoder
(`load_chain`), the stochastic uplift of `jobs/finetune_stochastic.py` (`load_stochastic`), and the station
table the decoder forecasts at. Shared by `jobs/forecast_e2e.py`, `jobs/ensemble.py` and `jobs/ose.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from wxray.config_yaml import load_yaml
from wxray.console import say
from wxray.data.e2e_windows import E2EData, prepare_e2e
from wxray.data.obs.kinds import kind_of
from wxray.data.obs.points import open_point_dataset
from wxray.errors import CheckpointError, ConfigError
from wxray.forecast import checkpoints
from wxray.forecast.forecaster import load_forecaster
from wxray.forecast.stages import StageModels, build_decoder, build_encoder, stage_identity, trained_stage
from wxray.job import recorded_path
from wxray.models import StochasticEncoder
from wxray.models.registry import build_forecaster


def inputs_used(cfg, data: E2EData) -> dict[str, str]:
    """The store and obs dir `cfg` left to the stages ("" keys), as `data` was read from: what a job records
    (`JobContext.record_resolved`)."""
    used = {"store": data.spec.store, "obs_dir": data.obs.obs_dir}
    return {k: v for k, v in used.items() if not getattr(cfg, k)}


def load_chain(stages: str | Path, store: str = "", obs_dir: str = "", deny: Sequence[str] = ()
               ) -> tuple[StageModels, E2EData, torch.nn.Module, torch.nn.Module, torch.nn.Module | None,
                          dict[str, str]]:
    """The training config, the data (store and streams overridable), encoder, processor and decoder."""
    stages = Path(stages)
    chain, enc, proc, dec = (trained_stage(stages, s) for s in ("chain", "encoder", "processor", "decoder"))
    if chain is None and (enc is None or proc is None):
        raise CheckpointError(f"stages {stages}: no chain stage and no encoder + processor stages to forecast with "
                              "(run jobs/train_e2e.py stage=encoder, stage=processor, ...)")
    ckpt, tcfg = chain or enc
    # the stages' own store and streams as they are here (moved with the project: under the wxray home)
    data_cfg = replace(tcfg.data, store=store or recorded_path(tcfg.data.store, "the stages' training store"),
                       obs_dir=obs_dir or recorded_path(tcfg.data.obs_dir, "the stages' observation streams"))
    tcfg = replace(tcfg, data=data_cfg)
    data = prepare_e2e(data_cfg, tcfg.encoder.patch_size)
    trained = checkpoints.apply_normalisation(data.spec, checkpoints.read_meta(ckpt), ckpt)
    if trained is not None:
        data.windows.spec = trained
    names = [s.name for s in data.obs.streams]
    for name in deny:
        if name not in names:
            raise ConfigError(f"deny names '{name}', not a stream the encoder reads ({', '.join(names)})")
    if names and set(names) <= set(deny):
        say(f"warning: deny withholds every stream ({', '.join(names)}): the encoder sees no observations, "
            "so the forecast starts from its learned prior alone")
    encoder, used = build_encoder(tcfg, data), {"encoder": str(ckpt)}
    if chain is not None:
        state, _ = checkpoints.load(ckpt, expect_model=stage_identity(tcfg, data, "chain"))
        encoder.load_state_dict(checkpoints.part(state, "encoder."))
        processor = build_forecaster(tcfg.processor, data.spec)
        processor.load_state_dict(checkpoints.part(state, "processor."))
        used = {"chain": str(ckpt)}
    else:
        state, _ = checkpoints.load(ckpt, expect_model=stage_identity(tcfg, data, "encoder"))
        checkpoints.load_model_weights(encoder, state, str(ckpt))
        processor = load_forecaster(proc[0], tcfg.processor, data.spec)
        used["processor"] = str(proc[0])
    decoder = None
    if dec is not None:
        dcfg = dec[1]
        data = replace(data, station_stream=dcfg.data.station_stream,
                       station_variables=list(dcfg.data.station_variables) or data.station_variables)
        state, _ = checkpoints.load(dec[0], expect_model=stage_identity(dcfg, data, "decoder"))
        decoder = build_decoder(dcfg, data)
        checkpoints.load_model_weights(decoder, state, str(dec[0]))
        used["decoder"] = str(dec[0])
    return tcfg, data, encoder.eval(), processor.eval(), None if decoder is None else decoder.eval(), used


def _finetune(stages: Path, stage: str) -> tuple[Path, dict] | None:
    run = stages / f"stochastic_{stage}"
    last = checkpoints.latest(run / "ray") if stage == "encoder" else _last_lead(run)
    if last is None:
        return None
    return last, load_yaml(run / "config.yaml")


def _last_lead(run: Path) -> Path | None:
    leads = sorted(run.glob("lead_*"), key=lambda p: int(p.name.split("_")[1]))
    return checkpoints.latest(leads[-1] / "ray") if leads else None


def load_stochastic(stages: Path, tcfg: StageModels, data: E2EData, members_m: int, members_n: int,
                    dropout: float, keys: tuple[str, str] = ("members.M", "members.N")
                    ) -> tuple[StochasticEncoder, torch.nn.Module, float, dict[str, str]]:
    """The stochastic encoder and the (MC-dropout) processor, and the dropout rate used. `keys`: the config
    keys of M and N, as the errors name them."""
    enc = _finetune(stages, "encoder")
    if enc is None:
        raise CheckpointError(f"{keys[0]}={members_m}: {stages} has no stochastic encoder to draw from (run "
                              "jobs/finetune_stochastic.py stage=encoder)")
    noise = enc[1].get("stochastic", {})
    senc = StochasticEncoder(build_encoder(tcfg, data), noise=noise.get("noise", "film"),
                             noise_dim=int(noise.get("noise_dim", 32)))
    checkpoints.load_model_weights(senc, checkpoints.load(enc[0])[0], str(enc[0]))
    used = {"stochastic_encoder": str(enc[0])}
    proc_ckpt = _finetune(stages, "processor")
    if proc_ckpt is not None:
        p = float(proc_ckpt[1].get("stochastic", {}).get("dropout", 0.0)) if dropout < 0 else dropout
        processor = build_forecaster(tcfg.processor, data.spec)
        weights = checkpoints.part(checkpoints.load(proc_ckpt[0])[0], "processor.")
        checkpoints.load_model_weights(processor, {"model": weights}, str(proc_ckpt[0]))
        used["stochastic_processor"] = str(proc_ckpt[0])
    else:
        p = max(dropout, 0.0)
        processor = None
    if members_n > 1 and p <= 0:
        raise ConfigError(f"{keys[1]}={members_n} dropout members need dropout p > 0 (finetune the processor with "
                          "jobs/finetune_stochastic.py stage=processor, or set dropout=)")
    return senc, processor, p, used


def station_table(data: E2EData) -> pd.DataFrame:
    """Every station of the station stream with its (last reported) position (read where the obs dir is: a
    path or a URL)."""
    s = next(s for s in data.obs.streams if s.name == data.station_stream)
    columns = ["station", "latitude", "longitude"] + (["altitude"] if data.station_altitude else [])
    t = open_point_dataset(kind_of(s).data_path(s, data.obs.obs_dir)).to_table(columns=columns).to_pandas()
    return t.drop_duplicates("station", keep="last").sort_values("station").reset_index(drop=True)
