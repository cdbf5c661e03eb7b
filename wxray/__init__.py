"""wxray: Ray-distributed training and ensemble inference for ML weather forecasting."""

# The ecCodes wheel bundles an old SQLite; whichever loads first wins for the process. Loading Python's
# own sqlite3 first keeps MLflow's sqlite store working after cfgrib/eccodes are imported.
import sqlite3  # noqa: F401

__version__ = "0.1.0"
