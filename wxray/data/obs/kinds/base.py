"""A stream kind: everything that differs between the kinds of observation stream (obs.yaml's `kind:`).

A kind owns, for every stream of that kind:

* its registry entry's rules: whether the entry may have `levels`, the least `max_per_step` (`min_per_step`),
  and the check of its data when obs.yaml is opened (`opened`; a gridded stream's grid is read there);
* where its data lies (`data_path`) and how many reports a period holds (`count_reports`);
* its windows: a reader of one stream, `window_reader(info, spec)(lo, hi) -> {"obs.<s>.<key>": array}` for the
  windows lo < time <= hi, holding the keys `keys(info, obs_dir)`: every one of `required`, some of `optional`;
* the observation encoder's embedding its windows feed (`embedding`, a key of `wxray.models.embeddings.EMBEDDINGS`,
  which reads exactly these keys) and what that embedding is told of the stream (`encoder_input`: plain values,
  made a `wxray.models.StreamInput` by `wxray.forecast.stages.stream_inputs`);
* whether its reports are station reports in the point Parquet layout (`stations`): the station decoder's targets
  and the station truth of verification read those.

A new kind is one module in `wxray/data/obs/kinds/` (a subclass) plus one line in `KINDS`
(`wxray/data/obs/kinds/__init__.py`). One whose windows need an embedding the encoder lacks also adds it to
`wxray/models/embeddings.py` (its batch keys, shape checks and SetConv mode) with one line in `EMBEDDINGS` there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from wxray.data import location
from wxray.data.obs.stream import ObsSpec, StreamInfo


class StreamWindows(Protocol):
    """One stream's reader: (b,) window starts `lo` and ends `hi` (datetime64[ns]) -> its batch arrays."""

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]: ...


class StreamKind(ABC):
    """The behaviour of one kind of stream (see the module docstring); instances are stateless."""

    name: ClassVar[str]  # obs.yaml's `kind:` value
    embedding: ClassVar[str]  # the encoder embedding its windows feed (wxray.models.embeddings.EMBEDDINGS)
    required: ClassVar[tuple[str, ...]]  # batch keys obs.<s>.<key> every window of such a stream holds
    optional: ClassVar[tuple[str, ...]] = ()  # keys some streams of the kind hold (`keys` says which)
    levels: ClassVar[bool] = False  # may an entry list levels (channels {var}_{level})
    min_per_step: ClassVar[int] = 0  # the least `max_per_step` of an entry
    stations: ClassVar[bool] = False  # station reports in the point Parquet layout (decoder targets, station truth)

    def data_path(self, info: StreamInfo, obs_dir: str | Path) -> str:
        """The stream's own data, a path or a URL as the obs dir is; checked to exist when obs.yaml is opened."""
        return location.join(obs_dir, info.path)

    def opened(self, info: StreamInfo, data: str, where: str) -> StreamInfo:
        """The entry once its data at `data` is checked, when obs.yaml is opened (DataErrors start with `where`)."""
        return info

    def keys(self, info: StreamInfo, obs_dir: str | Path) -> tuple[str, ...]:
        """The batch keys obs.<s>.<key> of this stream's windows: `required` and those of `optional` it holds."""
        return self.required

    def encoder_input(self, info: StreamInfo) -> dict[str, Any]:
        """What the encoder's embedding is told of the stream: the fields of `wxray.models.StreamInput` but `name`."""
        return {"embedding": self.embedding, "n_channels": info.n_channels}

    @abstractmethod
    def window_reader(self, info: StreamInfo, spec: ObsSpec) -> StreamWindows:
        """A reader of the stream's windows; made in the process that reads (it may hold open files)."""

    @abstractmethod
    def count_reports(self, info: StreamInfo, obs_dir: str | Path, lo: np.datetime64, hi: np.datetime64) -> int:
        """Reports of the stream with lo < time <= hi (rows of a point stream, time steps of a gridded one)."""
