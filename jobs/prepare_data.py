"""Convert an ERA5-style source (GRIB / NetCDF / zarr: a file, a glob or a store) into a wxray store.

    python jobs/prepare_data.py source=/path/era5.grib out=data/era5.zarr variables=[z,t] levels=[500,850]
    python jobs/prepare_data.py --config configs/prepare_data.yaml source=... out=... member=mean

Writes the zarr v3 store with its `stats/*` groups (atomically: a failure leaves no store) and prints
`RESULT {json}` with the variables, levels, number of times, grid, missing-value count and store path.
Bad input (corrupt file, missing variable/level, NaNs, bad time axis) -> one-line error, exit 2.
See wxray/data/convert.py for the conventions.
"""

import sys

from wxray.data.jobs import PrepareDataConfig, prepare_data_main
from wxray.job import run_job

if __name__ == "__main__":
    sys.exit(run_job("prepare_data", PrepareDataConfig, prepare_data_main, doc=__doc__))
