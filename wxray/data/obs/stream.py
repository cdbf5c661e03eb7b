"""One stream as obs.yaml describes it (`StreamInfo`) and what a window reader is built from (`ObsSpec`).

Plain values, whatever the stream's kind: they pickle cheaply to Ray tasks, and what differs between kinds is
the kind's (`wxray.data.obs.kinds`), looked up by `StreamInfo.kind`.

Channels of a stream (`StreamInfo.channels`): without levels its variables; with levels `f"{var}_{level}"`,
variable-major (only a kind whose entries may have levels has them: point). A level channel takes its
variable's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StreamInfo:
    """One stream as the registry describes it (plain values: pickles cheaply to Ray tasks)."""

    name: str
    kind: str  # a key of wxray.data.obs.kinds.KINDS
    path: str  # relative to the obs dir
    variables: list[str]
    levels: list[int] = field(default_factory=list)
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)
    noise: dict[str, float | None] = field(default_factory=dict)
    max_per_step: int = 0
    description: str = ""
    latitude: np.ndarray | None = None  # a stream on its own grid (gridded): its latitudes (ascending)
    longitude: np.ndarray | None = None  # and longitudes in [0, 360)

    @property
    def channels(self) -> list[str]:
        if self.levels:
            return [f"{v}_{lv}" for v in self.variables for lv in self.levels]
        return list(self.variables)

    @property
    def n_channels(self) -> int:
        return len(self.channels)

    def channel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) per channel, float32 (a level channel takes its variable's statistics)."""
        per = len(self.levels) or 1
        mean = np.repeat([self.mean[v] for v in self.variables], per).astype(np.float32)
        std = np.repeat([self.std[v] for v in self.variables], per).astype(np.float32)
        return mean, std

    def to_yaml(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "variables": list(self.variables),
                "levels": [int(x) for x in self.levels],
                "mean": {v: float(self.mean[v]) for v in self.variables},
                "std": {v: float(self.std[v]) for v in self.variables},
                "noise": {v: (None if self.noise.get(v) is None else float(self.noise[v])) for v in self.variables},
                "max_per_step": int(self.max_per_step), "description": self.description}


@dataclass
class ObsSpec:
    """What an `ObsWindowReader` needs (plain values: pickles cheaply to Ray tasks)."""

    obs_dir: str
    streams: list[StreamInfo]  # the selected streams in registry order
    step: np.timedelta64  # the store's time step
    window_steps: int = 1  # observations with t - window_steps * step < time <= t
    max_quality: int = 0  # keep observations whose quality <= this (0 good, 1 suspect, 2 bad)

    @property
    def window(self) -> np.timedelta64:
        return (self.window_steps * self.step).astype("timedelta64[ns]")
