"""Stream kinds by name: obs.yaml's `kind:` -> its `StreamKind` (`base.py` says what a kind owns).

A new stream kind is one module in `wxray/data/obs/kinds/` plus one line in `KINDS` below. Everything else looks a
stream's kind up here (`kind_of(info)`) and never compares it to a name (`tests/data/test_stream_kinds.py`).
"""

from __future__ import annotations

from wxray.data.obs.kinds.base import StreamKind, StreamWindows
from wxray.data.obs.kinds.gridded import GRIDDED, GriddedKind
from wxray.data.obs.kinds.point import POINT, PointKind
from wxray.data.obs.stream import StreamInfo

KINDS: dict[str, StreamKind] = {  # in the order error messages list them
    POINT: PointKind(),
    GRIDDED: GriddedKind(),
}


def kind_of(info: StreamInfo) -> StreamKind:
    """The kind of a stream whose entry obs.yaml's checks passed (an unknown kind is a KeyError: a bug)."""
    return KINDS[info.kind]


def station_kinds() -> list[str]:
    """The kinds whose streams hold station reports (decoder targets, station truth), for messages."""
    return [name for name, k in KINDS.items() if k.stations]


__all__ = ["KINDS", "StreamInfo", "StreamKind", "StreamWindows", "kind_of", "station_kinds"]
