"""Nested M x N ensembles of the uplifted end-to-end chain (`jobs/forecast_e2e.py members_m=M members_n=N`).

Member (i, j) of init t: encoder noise draw i (the stochastic encoder of `jobs/finetune_stochastic.py`), then
N rollouts under MC dropout, dropout member j redrawing its masks at every lead step. Draws come from their
coordinates, never from a shared stream:

    noise of (t, i)          torch.Generator seeded SeedSequence([seed, t in seconds, 1, i])
    dropout masks of (t,i,j) torch.Generator seeded SeedSequence([seed, t in seconds, 2, i, j]), advanced by
                             each lead step in order

so a member's draws do not depend on which other members or inits were computed with it, and a denial run
(`deny=[...]`) shares every draw with its baseline (common random numbers). With `batch_size=1` each forward
holds one init's M x N members, so an init forecast alone reproduces them bit for bit; in larger batches the
values agree to float round-off (the matrix kernels sum in another order for another batch shape).

Rows of a batch: (init, i, j) with j fastest. The forecast is written with dims (init_time, lead_time,
encoder_draw, dropout_draw, latitude, longitude), or one `member` dim when M or N is 1. The decoder is
deterministic: station forecasts are the decoded ensemble mean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from wxray.config import load_yaml
from wxray.data.e2e_windows import E2EData, E2EReader
from wxray.errors import CheckpointError, ConfigError
from wxray.models import RowGenerators, StochasticEncoder, mc_dropout, tile_members
from wxray.models.registry import build_forecaster
from wxray.platform.train import checkpoints
from wxray.platform.train.stage_config import TrainE2EConfig
from wxray.platform.train.stage_eval import physical
from wxray.platform.train.stages import StationSet, build_encoder, next_state, obs_of, processor_input

ENCODER_SOURCE, DROPOUT_SOURCE, ROUTING_SOURCE = 1, 2, 3


def draw_seed(seed: int, init_time: np.datetime64, *coords: int) -> int:
    t = int(np.datetime64(init_time, "s").astype(np.int64))
    return int(np.random.SeedSequence([int(seed), t, *map(int, coords)]).generate_state(1)[0])


def _finetune(stages: Path, stage: str) -> tuple[Path, dict] | None:
    run = stages / f"stochastic_{stage}"
    last = checkpoints.latest(run / "ray") if stage == "encoder" else _last_lead(run)
    if last is None:
        return None
    return last, load_yaml(run / "config.yaml")


def _last_lead(run: Path) -> Path | None:
    leads = sorted(run.glob("lead_*"), key=lambda p: int(p.name.split("_")[1]))
    return checkpoints.latest(leads[-1] / "ray") if leads else None


def _part(state: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state["model"].items() if k.startswith(prefix)}


def load_stochastic(stages: Path, tcfg: TrainE2EConfig, data: E2EData, members_m: int, members_n: int,
                    dropout: float, keys: tuple[str, str] = ("members_m", "members_n")
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
        checkpoints.load_model_weights(processor, {"model": _part(checkpoints.load(proc_ckpt[0])[0], "processor.")},
                                       str(proc_ckpt[0]))
        used["stochastic_processor"] = str(proc_ckpt[0])
    else:
        p = max(dropout, 0.0)
        processor = None
    if members_n > 1 and p <= 0:
        raise ConfigError(f"{keys[1]}={members_n} dropout members need dropout p > 0 (finetune the processor with "
                          "jobs/finetune_stochastic.py stage=processor, or set dropout=)")
    return senc, processor, p, used


@torch.no_grad()
def run_ensemble(data: E2EData, senc: StochasticEncoder, processor, decoder, anchors: np.ndarray, steps: int,
                 deny, members_m: int, members_n: int, dropout: float, seed: int, batch_size: int, device,
                 stations=None) -> tuple[np.ndarray, np.ndarray | None]:
    """(n_init, M*N, steps + 1, V, kept grid) physical states, member index i*N + j; station ensemble means."""
    spec, n = data.spec, len(data.spec.inputs)
    reader = E2EReader(data.spec, data.obs)
    times = reader.times(anchors)
    mn = members_m * members_n
    out = np.zeros((len(anchors), mn, steps + 1, n, *spec.kept_grid), np.float32)
    senc.eval().to(device)
    if dropout > 0:
        mc_dropout(processor, dropout)
    else:
        processor.eval()
    processor.to(device)
    st, at = None, None
    if stations is not None and decoder is not None:
        decoder.eval().to(device)
        at = StationSet.of(data, stations)
        st = np.zeros((len(anchors), steps + 1, len(stations), len(data.station_variables)), np.float32)
    for a in range(0, len(anchors), batch_size):
        rows = slice(a, a + batch_size)
        b = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in reader.inputs(anchors[rows]).items()}
        init_times = times[rows]
        noise = RowGenerators.from_seeds([draw_seed(seed, t, ENCODER_SOURCE, i) for t in init_times
                                          for i in range(members_m)], device=device)
        masks = RowGenerators.from_seeds([draw_seed(seed, t, DROPOUT_SOURCE, i, j) for t in init_times
                                          for i in range(members_m) for j in range(members_n)], device=device)
        z = tile_members(senc(obs_of(b), b["static"], deny=tuple(deny), members=members_m, noise_generator=noise),
                         members_n)
        x = tile_members(b["x"], mn)
        for k in range(steps + 1):
            if k:
                z = next_state(spec, z, processor(processor_input(z, x, n), generator=masks))
            out[rows, :, k] = physical(spec, z.cpu()).numpy().reshape(-1, mn, n, *spec.kept_grid)
            if st is not None:
                st[rows, k] = at.decode(decoder, z).reshape(-1, mn, *st.shape[2:]).mean(1).numpy()
    return out, st


def nested(forecast, members_m: int, members_n: int):
    """A `member` dim of M*N (index i*N + j) as (encoder_draw, dropout_draw); with M or N = 1 the single
    branch stays a plain `member` dim (a one-entry group dim would have no variance to split)."""
    if members_m == 1 or members_n == 1:
        return forecast
    import pandas as pd
    import xarray as xr

    from wxray.data.schema import INIT, LEAD
    from wxray.verify.ensemble import DROPOUT_DRAW, ENCODER_DRAW

    index = pd.MultiIndex.from_product([range(members_m), range(members_n)], names=[ENCODER_DRAW, DROPOUT_DRAW])
    out = forecast.assign_coords(xr.Coordinates.from_pandas_multiindex(index, "member")).unstack("member")
    return out.transpose(INIT, LEAD, ENCODER_DRAW, DROPOUT_DRAW, ...)


def describe(members_m: int, members_n: int, dropout: float, seed: int) -> dict[str, Any]:
    return {"members_m": members_m, "members_n": members_n, "dropout": dropout, "seed": seed,
            "seeds": "noise SeedSequence([seed, t, 1, i]); masks SeedSequence([seed, t, 2, i, j])"}
