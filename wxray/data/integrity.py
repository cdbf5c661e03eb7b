"""A zarr chunk that does not decode, named: which store, which variable, which chunk.

A truncated or corrupted chunk file surfaces deep in a lazy read as a codec's RuntimeError ("Zstd
decompression error", "Error -1 while decompressing data" from blosc), long after the store was opened, with
no word of where. `explain(error)` reads the failed read's traceback: zarr's selection frame holds the
array's store path and its codec pipeline the chunks of the batch; each of those is decoded again alone to
find the one that fails. The job then reports one line instead of a traceback (`wxray.job`).
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any

import zarr

DECODE_WORDS = re.compile(r"decompress|zstd|blosc|corrupt|invalid input data|frame size|lz4|gzip|crc", re.I)


def _frames(tb: TracebackType | None):
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def is_decode_error(error: BaseException) -> bool:
    """A codec failed to decode bytes read from a store (not a bug of ours, not a missing file)."""
    for e in _chain(error):
        codec_frame = any(("/numcodecs/" in f.f_code.co_filename or "/zarr/codecs/" in f.f_code.co_filename
                           or f.f_code.co_filename.endswith(".pyx")) for f in _frames(e.__traceback__))
        if isinstance(e, (RuntimeError, ValueError, OSError, TypeError)) and codec_frame and DECODE_WORDS.search(
                str(e)):
            return True
    return False


def _coords(key: str, array_path: str) -> tuple[int, ...] | None:
    rest = key[len(array_path):].strip("/") if array_path and key.startswith(array_path) else key
    rest = rest.removeprefix("c/").removeprefix("c.")
    try:
        return tuple(int(x) for x in re.split(r"[/.]", rest) if x != "")
    except ValueError:
        return None


def _bad_chunk(store_path: Any, keys: list[str]) -> str | None:
    """The first of `keys` (chunk keys of the array at `store_path`) that fails to decode on its own."""
    try:
        arr = zarr.open_array(store=store_path.store, path=store_path.path, mode="r")
    except Exception:
        return None
    for key in keys:
        coords = _coords(key, store_path.path)
        if coords is None or len(coords) != len(arr.chunks):
            continue
        region = tuple(slice(c * n, (c + 1) * n) for c, n in zip(coords, arr.chunks, strict=True))
        try:
            arr[region]
        except Exception:
            return key
    return None


def explain(error: BaseException) -> str | None:
    """One line naming the store, variable and chunk of a decode failure; None when `error` is no such failure."""
    if not is_decode_error(error):
        return None
    store_path, keys = None, []
    for e in _chain(error):
        for f in _frames(e.__traceback__):
            if f.f_code.co_name == "_get_selection" and "store_path" in f.f_locals:
                store_path = f.f_locals["store_path"]
            if f.f_code.co_name == "read_batch" and "batch_info" in f.f_locals:
                keys = [str(getattr(item[0], "path", "")) for item in list(f.f_locals["batch_info"])]
    cause = str(error).splitlines()[0] if str(error) else type(error).__name__
    if store_path is None:
        return f"a zarr chunk of an input store is corrupt or truncated ({cause}); rewrite or restore that store"
    root = str(getattr(store_path.store, "root", "") or store_path.store)
    variable = store_path.path.rsplit("/", 1)[-1]
    chunk = _bad_chunk(store_path, keys)
    where = f"chunk {chunk.removeprefix(store_path.path).strip('/')}" if chunk else "a chunk"
    return (f"store {root}: variable '{variable}', {where} is corrupt or truncated ({cause}); rewrite the store "
            f"or restore that chunk file")
