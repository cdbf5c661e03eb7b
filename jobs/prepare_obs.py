"""Convert a station table (CSV or Parquet) into a point stream of an obs dir.

    python jobs/prepare_obs.py source=synop.csv out=data/my_obs stream=synop
    python jobs/prepare_obs.py source=sondes.parquet out=data/my_obs stream=sondes variables=[t,u,v] \
        noise='{temperature: 0.5}'

Columns by name (case-insensitive): id|station|station_id|platform, time|date|datetime|valid_time,
lat|latitude, lon|longitude|long; optional elevation|altitude|elev, quality|qc|flag, level; the variables
are the other numeric columns (ERA5 short names become long names). Bad input is a one-line error and
nothing is written. Prints `RESULT {json}`. See wxray/data/obs/prepare.py.
"""

import sys

from wxray.job import run_job
from wxray.prepare.obs import PrepareObsConfig, prepare_obs_main

if __name__ == "__main__":
    sys.exit(run_job("prepare_obs", PrepareObsConfig, prepare_obs_main, doc=__doc__))
