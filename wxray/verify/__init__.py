"""Verification: WeatherBench 2 style scores over xarray with named dims, and their statistics.

No Ray here: these are plain functions over per-lead fields and per-initialisation score series, so
the same code scores a forecast on a laptop or inside a Ray task. Import what you use from its module
(`wxray.verify.deterministic`, `ensemble`, `metrics`, `scorecard`, `inference`, ...): the package itself imports
nothing, so a training worker that names a score of `metrics` does not load the statistics and plots.
"""
