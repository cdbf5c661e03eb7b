"""Convert an ERA5-style source (GRIB / NetCDF / zarr: a file, a glob or a store) into a wxray store.

    python jobs/prepare_data.py source=/path/era5.grib out=data/era5.zarr variables=[z,t] levels=[500,850]
    python jobs/prepare_data.py --config configs/prepare_data.yaml source=... out=... member=mean

Writes the zarr v3 store with its `stats/*` groups (atomically: a failure leaves no store) and prints
`RESULT {json}` with the variables, levels, number of times, grid, missing-value count and store path.
Bad input (corrupt file, missing variable/level, NaNs, bad time axis) -> one-line error, exit 2.
See wxray/data/convert.py for the conventions.

    python jobs/prepare_data.py mode=view source=gs://weatherbench2/.../era5.zarr out=data/era5.view
    python jobs/prepare_data.py mode=view source=... variables=[geopotential] levels=[500] time_stride=8

mode=view reads a WeatherBench 2 / ARCO-ERA5 zarr store in place: it writes only a small sidecar (statistics,
climatology, the selection, the source's fingerprint; one streaming pass on Ray tasks) that every job takes as
its store. See wxray/data/view.py.
"""

import sys

from wxray.job import run_job
from wxray.platform.ingest.prepare import prepare_data_main
from wxray.prepare.stores import PrepareDataConfig

if __name__ == "__main__":
    sys.exit(run_job("prepare_data", PrepareDataConfig, prepare_data_main, doc=__doc__))
