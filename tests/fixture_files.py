"""Paths of the small real files shipped in tests/fixtures/ (source and licence in its README.md)."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ERAINT = FIXTURES / "eraint_uvz.nc"
ERA5_MEMBERS = FIXTURES / "era5-levels-members.grib"
ERA5_CORRUPTED = FIXTURES / "era5-levels-corrupted.grib"
MISSING_GRIB = FIXTURES / "fields_with_missing_values.grib"
