"""wxray data layer: convert ERA5-style sources into wxray stores, compute statistics, make the sample.

* `wxray.data.schema`   — the store conventions (given).
* `wxray.data.convert`  — `convert_source`: GRIB / NetCDF / zarr -> zarr v3 store (+ stats).
* `wxray.data.stats`    — `compute_stats` / `write_stats` / `add_stats`: the `stats/<name>` groups.
* `wxray.data.sample`   — the embedded shallow-water sample (`make_sample_store`, `ensure_sample_store`).

Submodules are imported lazily (no torch import for a plain `import wxray.data`).
"""
