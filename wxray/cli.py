"""The `wxray` command (installed with the package): every job under one name, from any directory.

    wxray train [--config FILE] [key=value ...]       # = python jobs/train_sparse.py ...
    wxray evaluate forecast=<zarr> truth=<store>      # = python jobs/evaluate.py ...
    wxray <job> --help                                # every key with its type, default and doc

Each entry names the job's config class and main function by import path: `wxray --help` imports
neither, `wxray <job> --help` only the config.
"""

from __future__ import annotations

import importlib
import sys

from wxray.job import run_job

JOBS: dict[str, tuple[str, str, str, str]] = {
    # command: (job name, config class, main, one-line doc)
    "train": ("train_sparse", "wxray.platform.train.config:TrainSparseConfig",
              "wxray.platform.train.sparse:train_sparse",
              "train a forecaster on Ray Train (FSDP2), roll it out and score it"),
    "evaluate": ("evaluate", "wxray.verify.evaluate:EvaluateConfig", "wxray.platform.ensemble.evaluate:evaluate_job",
                 "WeatherBench-2-style scorecard of a forecast zarr against a truth store or file"),
    "forecast": ("forecast", "wxray.forecast.job:ForecastConfig",
                 "wxray.platform.ensemble.forecast:forecast_job",
                 "forecast with a trained checkpoint (routing ensembles): forecast.zarr + per-lead scores"),
    "train-e2e": ("train_e2e", "wxray.platform.train.stage_config:TrainE2EConfig", "wxray.platform.train.e2e:train_e2e",
                  "train one stage of the end-to-end system (encoder|processor|decoder|chain) on Ray Train"),
    "finetune-stochastic": ("finetune_stochastic", "wxray.platform.train.stochastic:FinetuneStochasticConfig",
                            "wxray.platform.train.stochastic:finetune_stochastic",
                            "uplift an end-to-end chain: noise-conditioned encoder, MC-dropout processor, fair CRPS"),
    "forecast-e2e": ("forecast_e2e", "wxray.forecast.job_e2e:ForecastE2EConfig",
                     "wxray.forecast.job_e2e:forecast_e2e",
                     "observations -> analysis -> rollout -> station forecasts with a trained end-to-end chain"),
    "ensemble": ("ensemble", "wxray.platform.ensemble.batch:EnsembleConfig", "wxray.platform.ensemble.batch:ensemble",
                 "nested M x N (x R) ensembles of the uplifted chain on Ray actors; variance split maps and scores"),
    "ose": ("ose", "wxray.platform.ensemble.ose:OSEConfig", "wxray.platform.ensemble.ose:ose",
            "observing-system experiments: each stream denied in turn, U_enc / U_drop changes with bootstrap CIs"),
    "sweep": ("sweep", "wxray.tune.sweep:SweepConfig", "wxray.tune.sweep:sweep",
              "Ray Tune sweep over training config keys (ASHA, MLflow child runs, restore, best config)"),
    "prepare-data": ("prepare_data", "wxray.prepare.stores:PrepareDataConfig",
                     "wxray.platform.ingest.prepare:prepare_data_main",
                     "convert ERA5 NetCDF / GRIB / zarr into a wxray store with statistics, or view a "
                     "WeatherBench 2 / ARCO-ERA5 store in place (mode=view)"),
    "make-sample-data": ("make_sample_data", "wxray.prepare.stores:SampleDataConfig",
                         "wxray.prepare.stores:make_sample_main",
                         "generate the shallow-water sample store (synthetic, not ERA5)"),
    "make-sample-obs": ("make_sample_obs", "wxray.prepare.obs:SampleObsConfig",
                        "wxray.prepare.obs:make_sample_obs_main",
                        "derive synthetic observation streams (stations, ships, profiles, swaths) from a store"),
    "prepare-obs": ("prepare_obs", "wxray.prepare.obs:PrepareObsConfig", "wxray.prepare.obs:prepare_obs_main",
                    "convert a station table (CSV / Parquet) into a point stream of an obs dir"),
}


def _load(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def usage() -> str:
    width = max(map(len, JOBS))
    lines = ["usage: wxray <job> [--config FILE] [key=value ...] [--verbose] [--help]", "", "jobs:"]
    lines += [f"  {cmd:<{width}}  {doc}" for cmd, (_, _, _, doc) in JOBS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    cmd = argv[0].replace("_", "-")
    if cmd not in JOBS:
        print(f"error: unknown job '{argv[0]}' (jobs: {', '.join(JOBS)})", file=sys.stderr)
        return 2
    job, cfg_cls, fn, doc = JOBS[cmd]

    def job_main(cfg, ctx):  # imported only when the job runs (not for --help or a bad config)
        return _load(fn)(cfg, ctx)

    return run_job(job, _load(cfg_cls), job_main, argv[1:], doc=f"wxray {cmd}: {doc}")


if __name__ == "__main__":
    sys.exit(main())
