"""Observation streams (`obs dir`: obs.yaml + Parquet point streams + zarr gridded streams).

* `wxray.data.obs.registry` — obs.yaml: `Registry`, `open_registry`, `make_obs_spec`.
* `wxray.data.obs.stream`   — `StreamInfo` (one stream's entry) and `ObsSpec` (a window reader's spec): plain values.
* `wxray.data.obs.kinds`    — stream kinds by name (`KINDS`): per kind its entry's rules, data path, windows
                              and encoder embedding (`kinds/point.py`, `kinds/gridded.py`).
* `wxray.data.obs.points`   — point streams on disk: Parquet, hive-partitioned by stream and day.
* `wxray.data.obs.gridded`  — gridded streams (swaths) on disk: zarr (time, channel, latitude, longitude), NaN = gap.
* `wxray.data.obs.windows`  — `ObsWindowReader`: the observations of a batch of assimilation windows.
* `wxray.data.obs.sample`   — `make_sample_obs`: synthetic streams derived from a store (the sample).
* `wxray.data.obs.prepare`  — `prepare_obs`: a user's station table (CSV / Parquet) -> a point stream.
"""

from wxray.data.obs.registry import ObsSpec, Registry, StreamInfo, make_obs_spec, open_registry
from wxray.data.obs.windows import ObsWindowReader

__all__ = ["ObsSpec", "ObsWindowReader", "Registry", "StreamInfo", "make_obs_spec", "open_registry"]
