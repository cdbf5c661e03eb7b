"""Where data lives: a local path or an fsspec URL (`s3://bucket/key`, `gs://bucket/key`, `file:///abs/path`).

Every key that names a store may be a URL. Remote stores are read lazily through fsspec (s3fs, gcsfs): zarr
asks for the chunks it needs and nothing is copied. Credentials come only from the standard chains -- the
environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `GOOGLE_APPLICATION_CREDENTIALS`), `~/.aws`, an
instance role -- never from a config value, which would reach MLflow params. Public buckets (WeatherBench 2,
ARCO-ERA5) are read without credentials with `anonymous=true` (any job) or `WXRAY_ANONYMOUS=1`.

The invariant: `exists`, `open_zarr` and `join` take the same strings for local paths and URLs, so a caller
never branches on where a store is.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import fsspec
import xarray as xr

from wxray.data import view
from wxray.errors import ConfigError, DataError

ANONYMOUS_ENV = "WXRAY_ANONYMOUS"
REMOTE_SCHEMES = ("s3", "gs", "gcs", "memory")
# Where and how to reach object storage, never who: what every Ray worker needs to read as the driver does.
# Credentials stay with each node's own chain (a job's runtime env would show them in the Ray dashboard).
SETTINGS_ENV = (ANONYMOUS_ENV, "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION")


def read_anonymously() -> None:
    """Read public buckets without credentials from here on, in this process and the Ray workers it starts
    (`session.ensure_ray` forwards SETTINGS_ENV): the `anonymous=true` key of every job."""
    os.environ[ANONYMOUS_ENV] = "1"


def settings_env() -> dict[str, str]:
    """The storage settings of SETTINGS_ENV set in this process."""
    return {k: os.environ[k] for k in SETTINGS_ENV if os.environ.get(k)}


def scheme(location: str | os.PathLike) -> str:
    """The URL scheme of `location` ('s3', 'gs', 'file', ...), '' for a plain path."""
    text = str(location)
    return text.split("://", 1)[0].lower() if "://" in text else ""


def is_remote(location: str | os.PathLike) -> bool:
    return scheme(location) in REMOTE_SCHEMES


def local_path(location: str | os.PathLike) -> Path:
    """A local location as a Path (`file://` stripped)."""
    text = str(location)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def spelled(location: str | os.PathLike) -> str:
    """A location as messages and registries keep it: a URL as given, less a trailing '/' (Path would make
    `s3://a/b` `s3:/a/b`); a local path as Path spells it (`file://` stripped)."""
    if is_remote(location):
        return str(location).rstrip("/")
    return str(local_path(location))


def storage_options(location: str | os.PathLike) -> dict[str, Any]:
    """fsspec options for a location: anonymous access when asked for, else the library's credential chain;
    the S3 endpoint from `AWS_ENDPOINT_URL(_S3)`, passed explicitly rather than left to botocore's config."""
    s = scheme(location)
    anon = os.environ.get(ANONYMOUS_ENV, "") not in ("", "0", "false")
    if s == "s3":
        # bounded: an unreachable endpoint is an error after a few seconds, not botocore's minutes of retries
        opts: dict[str, Any] = {"anon": anon,
                                "config_kwargs": {"connect_timeout": 5, "read_timeout": 60,
                                                  "retries": {"max_attempts": 2, "mode": "standard"}}}
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            opts["client_kwargs"] = {"endpoint_url": endpoint}
        return opts
    if s in ("gs", "gcs"):
        return {"token": "anon"} if anon else {}
    return {}


def filesystem(location: str | os.PathLike):
    """(fsspec filesystem, path inside it) of a location."""
    s = scheme(location)
    if not s or s == "file":
        return fsspec.filesystem("file"), str(local_path(location))
    try:
        fs = fsspec.filesystem(s, **storage_options(location))
    except ImportError:
        package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}.get(s, f"the fsspec backend of {s}://")
        raise ConfigError(f"{location}: reading {s}:// locations needs {package} (pip install {package})") from None
    return fs, str(location).split("://", 1)[1]


def exists(location: str | os.PathLike) -> bool:
    if not is_remote(location):
        return local_path(location).exists()
    fs, path = filesystem(location)
    return bool(fs.exists(path))


def is_dir(location: str | os.PathLike) -> bool:
    """A folder at a path, or a prefix with objects under it at a URL."""
    if not is_remote(location):
        return local_path(location).is_dir()
    fs, path = filesystem(location)
    return bool(fs.isdir(path))


def reachable(location: str | os.PathLike, what: str) -> bool:
    """`exists`, with an unreachable endpoint, refused credentials or a missing backend as one-line errors
    naming `what` and the location (ConfigError for a backend to install, DataError otherwise)."""
    try:
        return exists(location)
    except ConfigError:
        raise
    except Exception as e:
        raise DataError(f"{what} {location}: cannot be reached ({type(e).__name__}: {e})".splitlines()[0]) from None


def join(location: str | os.PathLike, *parts: str) -> str:
    if not is_remote(location):
        return str(local_path(location).joinpath(*parts))
    return "/".join([str(location).rstrip("/"), *parts])


def zarr_target(location: str | os.PathLike) -> tuple[str, dict[str, Any] | None]:
    """(store argument, storage_options) for xarray's open_zarr / to_zarr."""
    if not is_remote(location):
        return str(local_path(location)), None
    return str(location), storage_options(location)


def open_zarr(location: str | os.PathLike, **kwargs):
    """xr.open_zarr on a path or a URL (lazily, consolidated metadata not required). A view's sidecar
    (`wxray.data.view`) opens as the fields of its source; its groups (`group=`) as they are."""
    target, opts = zarr_target(location)
    given = dict(kwargs)
    if opts is not None:
        kwargs["storage_options"] = opts
    kwargs.setdefault("consolidated", False)
    ds = xr.open_zarr(target, **kwargs)
    if kwargs.get("group") is None and view.is_view(ds):
        # the source's own metadata: WeatherBench 2 and ARCO are consolidated
        return view.through(ds, lambda source: open_source(source, given))
    return ds


def open_source(location: str, kwargs: dict[str, Any]):
    """A view's source: consolidated metadata where it has them (WeatherBench 2, ARCO), else without."""
    with warnings.catch_warnings():  # zarr's "falling back to unconsolidated metadata"
        warnings.simplefilter("ignore", RuntimeWarning)
        return open_zarr(location, **{**kwargs, "consolidated": None})


def arrow_filesystem(location: str | os.PathLike):
    """(pyarrow filesystem, path inside it) for Ray's `storage_filesystem`: the fsspec filesystem of
    `filesystem` wrapped, so Ray Train writes with the same endpoint, credentials and retries as wxray reads;
    (None, local path) for a local location."""
    if not is_remote(location):
        return None, str(local_path(location))
    import pyarrow.fs

    fs, path = filesystem(location)
    return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)), path


def read_text(location: str | os.PathLike) -> str:
    if not is_remote(location):
        return local_path(location).read_text()
    fs, path = filesystem(location)
    with fs.open(path, "r") as f:
        return f.read()


def put(local: str | os.PathLike, location: str | os.PathLike, exclude: tuple[str, ...] = ()) -> None:
    """Copy a local file, or a folder's entries but those named in `exclude` (file by file, replacing what
    is there), to `location`."""
    src = Path(local)
    fs, path = filesystem(location)
    fs.makedirs(path.rsplit("/", 1)[0] if src.is_file() else path, exist_ok=True)  # no-op on object stores
    if src.is_file():
        fs.put_file(str(src), path)
        return
    for entry in sorted(src.iterdir()):
        if entry.name in exclude:
            continue
        files = sorted(f for f in entry.rglob("*") if f.is_file()) if entry.is_dir() else [entry]
        for f in files:
            target = f"{path.rstrip('/')}/{f.relative_to(src).as_posix()}"
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(f), target)


def get(location: str | os.PathLike, local: str | os.PathLike) -> Path:
    """Copy the file or folder `location` (a URL or a local path) to the local path `local`."""
    fs, path = filesystem(location)
    if not is_remote(location):
        path = os.path.abspath(path)  # fsspec lists a local folder's files by their absolute paths
    dst = Path(local)
    if fs.isdir(path):
        dst.mkdir(parents=True, exist_ok=True)
        for remote in fs.find(path):
            rel = remote[len(path.rstrip("/")) + 1:]
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(dst / rel))
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(dst))
    return dst


def remove(location: str | os.PathLike) -> None:
    """Delete a file or a folder (recursively), local or remote; nothing there is fine."""
    if not is_remote(location):
        p = local_path(location)
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        return
    fs, path = filesystem(location)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def glob(location: str | os.PathLike, pattern: str) -> list[str]:
    """The locations under `location` matching `pattern` (a glob relative to it), as the caller spelled
    the root: paths for a local root, URLs for a remote one."""
    if not is_remote(location):
        return [str(p) for p in local_path(location).glob(pattern)]
    fs, path = filesystem(location)
    prefix = scheme(location) + "://"
    return [prefix + p for p in fs.glob(f"{path.rstrip('/')}/{pattern}")]
