"""Where a routing ensemble's spread comes from (issue 28 item 4): is a small spread the model or the code?

    python benchmarks/bench_routing_spread.py --checkpoint runs/train_sparse/<run> [--inits 24] [--members 8]

For the checkpoint's test inits, one step ahead, in normalised units and per channel:
  rmse        error of the ensemble mean of `members` routing draws against the truth
  spread      sqrt of the members' unbiased variance, averaged over grid and inits (the SSR numerator)
  ssr         spread / rmse * sqrt((M + 1) / M)
  middle      RMS of the routed middle blocks' whole contribution: the forecast with them minus the forecast
              with them skipped (the delta set to 0, the same selection), one draw
  token_delta RMS of the middle blocks' delta on the tokens they see, over the RMS of those tokens
  spread/middle  the share of the middle blocks' contribution that changes from draw to draw
  distinct    mean fraction of tokens two members route differently (1 - overlap / K)
and, as a check of the code, that two members draw different selections and that a member recomputed alone
is bit-identical to itself in the ensemble, at batch_size 1 and 8 (CPU: models/batch_invariance.py), with the
members/s of both.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from wxray.data.anchors import split_anchors, valid_anchors
from wxray.data.schema import open_store
from wxray.data.windows import WindowReader
from wxray.forecast import checkpoints
from wxray.forecast.forecaster import load_forecaster
from wxray.forecast.job import find_checkpoint, trained_spec, training_configs
from wxray.forecast.rollout import per_sample_routing, rollout
from wxray.forecast.seeds import coordinate_generator


def routers(model):
    return [m for m in model.modules() if hasattr(m, "sparse_stage")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--inits", type=int, default=24)
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    ckpt = find_checkpoint(args.checkpoint)
    meta = checkpoints.read_meta(ckpt)
    model_cfg, data_cfg = training_configs(ckpt, meta)
    ds = open_store(data_cfg.store)
    spec = trained_spec(ckpt, meta, data_cfg.store, ds, model_cfg, data_cfg)
    model = load_forecaster(ckpt, model_cfg, spec).eval()
    anchors = split_anchors(ds, valid_anchors(ds, spec.history, spec.lead_steps), data_cfg)["test"][: args.inits]
    reader = WindowReader(spec)
    batch = {k: torch.from_numpy(np.asarray(v)) for k, v in reader({"anchor": anchors}).items()}
    x, y = batch["x"], batch["y"]
    times = ds["time"].values[anchors]
    stacks = routers(model)
    seen: dict[str, list] = {"indices": [], "delta": [], "tokens": []}
    originals = [r.sparse_stage for r in stacks]

    def recording(stage):
        def wrapped(x0, indices, *a, **k):
            out = stage(x0, indices, *a, **k)
            seen["indices"].append(indices.clone())
            picked = torch.gather(x0, 1, indices.unsqueeze(-1).expand(-1, -1, x0.shape[-1]))
            seen["tokens"].append(picked.pow(2).mean().sqrt().item())
            seen["delta"].append(((out - x0).pow(2).sum() / picked.numel()).sqrt().item())
            return out
        return wrapped

    def skipping(x0, indices, *a, **k):
        return x0

    preds = []
    with torch.no_grad():
        for m in range(args.members):
            gens = [coordinate_generator(0, t, m) for t in times]
            for r, stage in zip(stacks, originals, strict=True):
                r.sparse_stage = recording(stage)
            with per_sample_routing(model, gens):
                preds.append(model(x).float())
            for r, stage in zip(stacks, originals, strict=True):
                r.sparse_stage = stage
        for r in stacks:
            r.sparse_stage = skipping
        with per_sample_routing(model, [coordinate_generator(0, t, 0) for t in times]):
            skipped = model(x).float()
        for r, stage in zip(stacks, originals, strict=True):
            r.sparse_stage = stage
    p = torch.stack(preds)  # (M, B, V, H, W), normalised outputs
    mean = p.mean(0)
    n = args.members
    spread = p.var(0, unbiased=True).mean((0, 2, 3)).sqrt()
    rmse = (mean - y).pow(2).mean((0, 2, 3)).sqrt()
    middle = (preds[0] - skipped).pow(2).mean((0, 2, 3)).sqrt()
    ind = seen["indices"]
    per_member = len(ind) // n
    a, b = ind[0], ind[per_member]
    overlap = np.mean([len(set(a[i].tolist()) & set(b[i].tolist())) / a.shape[1] for i in range(a.shape[0])])
    names = [c.name for c in spec.targets]
    rows = {name: {"rmse": float(rmse[i]), "spread": float(spread[i]),
                   "ssr": float(spread[i] / rmse[i] * math.sqrt((n + 1) / n)), "middle": float(middle[i]),
                   "spread/middle": float(spread[i] / middle[i])} for i, name in enumerate(names)}
    checks = {"token_delta": float(np.mean(seen["delta"]) / np.mean(seen["tokens"])),
              "distinct": float(1 - overlap), "keep_ratio": model_cfg.keep_ratio,
              "split": list(model_cfg.split)}
    # the code: a member alone equals itself in the batch (batch_size 1), and within rounding at batch 8
    t0 = time.perf_counter()
    full1 = rollout(model, spec, anchors[:4], steps=2, members=list(range(4)), batch_size=1)
    t1 = time.perf_counter()
    full8 = rollout(model, spec, anchors[:4], steps=2, members=list(range(4)), batch_size=8)
    t2 = time.perf_counter()
    alone = rollout(model, spec, anchors[2:3], steps=2, members=[3], batch_size=1)
    checks["alone_equals_batch1"] = bool(np.array_equal(alone[0, 0], full1[2, 3]))
    checks["batch8_equals_batch1"] = bool(np.array_equal(full8, full1))
    checks["batch8_max_rel_diff"] = float(np.abs(full8 - full1).max() / np.abs(full1).max())
    checks["members_per_s_batch1"] = 16 / (t1 - t0)
    checks["members_per_s_batch8"] = 16 / (t2 - t1)
    out = {"channels": rows, "checks": checks, "members": n, "inits": len(anchors)}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
