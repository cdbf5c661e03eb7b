"""The names of dimensions and table columns, defined once (WeatherBench 2 / ERA5 conventions).

Stores: `time`, `level` (hPa), `latitude`, `longitude` (and `trajectory` for a sample store of several
runs). Forecasts: `init_time` x `lead_time` [x `member`] -- the same names are the columns of station
forecast tables. Nested ensembles name their draws in `wxray.verify.ensemble` (`encoder_draw`, ...).
"""

TIME, LEVEL, LAT, LON = "time", "level", "latitude", "longitude"
INIT, LEAD, MEMBER = "init_time", "lead_time", "member"
TRAJECTORY = "trajectory"
