"""Open raw sources — GRIB (cfgrib), NetCDF 3/4, zarr — as lazy xarray Datasets.

`open_source(source)` resolves a file, a glob or a zarr store and returns one `Part` per file and, for
GRIB, per hypercube (`cfgrib.open_datasets`): a file holding pressure-level and surface fields gives
several parts, merged later by `wxray.data.normalize.combine`. Nothing is loaded here: data are read
block by block when the store is written.

GRIB files are first scanned message by message in a child process (`check_grib`): a truncated or
corrupt file becomes a `DataError` even if ecCodes were to abort, and cfgrib is then asked to raise
(`errors="raise"`) instead of silently skipping a corrupt message. Shared GRIB files are opened
without writing an index beside them (`indexpath=""`).
"""

from __future__ import annotations

import glob
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import scipy.io
import xarray as xr

from wxray.data import location
from wxray.errors import DataError

GRIB_SUFFIXES = {".grib", ".grib1", ".grib2", ".grb", ".grb1", ".grb2"}
NETCDF_SUFFIXES = {".nc", ".nc3", ".nc4", ".netcdf", ".cdf", ".h5", ".hdf5"}
ZARR_MARKERS = ("zarr.json", ".zgroup", ".zarray", ".zmetadata")


@dataclass
class Part:
    """One lazily opened dataset and the file(s) it came from (for error messages)."""

    ds: xr.Dataset
    where: str


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def resolve_source(source: str) -> list[str]:
    """The files (or the single zarr store / URL) named by `source`."""
    if not source:
        raise DataError("source: no source given (set source=<file|glob|zarr store>)")
    if location.scheme(source):  # a URL: read in place
        return [source]
    if any(c in source for c in "*?["):
        files = sorted(glob.glob(source))
        if not files:
            raise DataError(f"source {source}: no file matches this pattern")
        return files
    if not Path(source).exists():
        raise DataError(f"source {source} does not exist "
                        f"(expected a GRIB/NetCDF file, a glob or a zarr store)")
    return [source]


def detect_kind(path: str) -> str:
    """'grib', 'netcdf' or 'zarr' from the content (magic bytes), else from the suffix."""
    if location.scheme(path):
        return "zarr"
    p = Path(path)
    if p.is_dir():
        if any((p / m).exists() for m in ZARR_MARKERS):
            return "zarr"
        raise DataError(f"source {p} is a directory but not a zarr store (no zarr.json or .zgroup)")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise DataError(f"source {p} cannot be read ({first_line(e)})") from None
    if head[:4] == b"GRIB":
        return "grib"
    if head[:3] == b"CDF" or head[:4] == b"\x89HDF":
        return "netcdf"
    if p.suffix.lower() in GRIB_SUFFIXES:
        return "grib"
    if p.suffix.lower() in NETCDF_SUFFIXES:
        return "netcdf"
    raise DataError(f"source {p}: unknown format (expected GRIB, NetCDF 3/4 or a zarr store)")


_SCAN = r"""
import sys
import eccodes
n = 0
with open(sys.argv[1], "rb") as f:
    while True:
        h = eccodes.codes_grib_new_from_file(f)
        if h is None:
            break
        eccodes.codes_get(h, "totalLength")
        eccodes.codes_release(h)
        n += 1
print(n)
"""


def check_grib(path: str, timeout_s: float = 600.0) -> int:
    """Walk every GRIB message of `path` in a child process; return the count or raise DataError."""
    try:
        r = subprocess.run([sys.executable, "-c", _SCAN, str(path)], capture_output=True, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DataError(f"{path}: scanning the GRIB messages took more than {timeout_s:.0f} s") from None
    if r.returncode < 0:
        raise DataError(f"{path}: corrupt GRIB file (the GRIB decoder died with signal {-r.returncode})")
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {r.returncode}"
        name, sep, msg = why.partition(": ")
        if sep and " " not in name:  # "gribapi.errors.WrongLengthError: ..." -> "WrongLengthError: ..."
            why = f"{name.rsplit('.', 1)[-1]}: {msg}"
        if "eccodes" in why.lower() and "no module" in why.lower():
            raise DataError(f"{path}: reading GRIB needs the 'eccodes' package ({why})")
        raise DataError(f"{path}: corrupt or truncated GRIB file ({why})")
    try:
        n = int(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        n = 0
    if n == 0:
        raise DataError(f"{path}: no GRIB message found (empty or not a GRIB file)")
    return n


def open_grib(path: str, **open_kwargs) -> list[xr.Dataset]:
    """Every hypercube of a GRIB file, after `check_grib`; `open_kwargs` go to xarray (e.g. decode_timedelta)."""
    check_grib(path)
    try:
        import cfgrib
    except ImportError as e:  # pragma: no cover - cfgrib is a project dependency
        raise DataError(f"{path}: reading GRIB needs cfgrib ({first_line(e)})") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dss = cfgrib.open_datasets(str(path), backend_kwargs={"indexpath": "", "errors": "raise"},
                                       cache=False, **open_kwargs)
    except Exception as e:  # cfgrib / ecCodes raise many types for a bad file
        raise DataError(f"{path}: cannot read GRIB file ({first_line(e)})") from None
    if not dss:
        raise DataError(f"{path}: no GRIB field could be read")
    return dss


def check_netcdf_complete(path: str) -> None:
    """DataError unless a classic (CDF-1/2) NetCDF file holds every byte its header promises: the netCDF
    library reads a truncated one without a word, as fill values, which then fail far later with an odd
    message (a coordinate 'repeated', month numbers out of range)."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic not in (b"CDF\x01", b"CDF\x02"):
        return  # NetCDF-4 (HDF5) and CDF-5: their libraries refuse a truncated file on opening
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with scipy.io.netcdf_file(path, mmap=True) as nc:
                for var in nc.variables.values():
                    var.data.shape  # noqa: B018  (mapping each variable checks its extent against the file)
    except Exception as e:
        raise DataError(f"{path}: the NetCDF file is truncated or corrupt ({first_line(e)})") from None


def open_netcdf(path: str, **open_kwargs) -> xr.Dataset:
    check_netcdf_complete(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "non-conforming _FillValue" of packed netCDF3
            return xr.open_dataset(path, cache=False, chunks=None, **open_kwargs)
    except Exception as e:
        raise DataError(f"{path}: cannot read NetCDF file ({first_line(e)})") from None


def open_zarr_source(path: str) -> xr.Dataset:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return xr.open_dataset(path, engine="zarr", consolidated=None, chunks=None, cache=False)
    except Exception as e:
        raise DataError(f"{path}: cannot read zarr store ({first_line(e)})") from None


def open_source(source: str) -> list[Part]:
    """Every part (file x hypercube) of `source`, opened lazily."""
    parts: list[Part] = []
    for path in resolve_source(source):
        kind = detect_kind(path)
        if kind == "grib":
            dss = open_grib(path)
        elif kind == "netcdf":
            dss = [open_netcdf(path)]
        else:
            dss = [open_zarr_source(path)]
        parts.extend(Part(ds, str(path)) for ds in dss)
    return parts
