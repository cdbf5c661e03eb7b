"""Where a forecast's work runs: Ray actors, each holding one model replica (`WorkersConfig`, the `workers.*`
keys of jobs/ensemble.py, jobs/ose.py and jobs/forecast.py). A configuration only: the actors themselves are
the Ray layer's (`wxray.platform.cluster.replicas`, `wxray.platform.ensemble.actors`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from wxray.config import NonNegFloat, NonNegInt, PosInt, Range
from wxray.errors import ConfigError


@dataclass
class WorkersConfig:
    actors: PosInt = 2  # model replicas (Ray actors); each computes whole units
    num_cpus: Annotated[float, Range(0)] = 1.0  # CPUs per actor (also its torch threads when num_gpus = 0)
    num_gpus: NonNegFloat = 0.0  # GPUs per actor, whole or fractional (0.5: two replicas share a GPU)
    vendor: Literal["any", "nvidia", "amd"] = "any"  # any: actors on NVIDIA and AMD nodes at once
    device: str = "auto"  # auto = the actor's GPU when it has one, else cpu; cuda / cuda:<i> need num_gpus > 0
    max_restarts: NonNegInt = 3  # an actor that dies is restarted this often; its units are retried

    def validate(self) -> None:
        # Checked here, on the driver: an actor that cannot reach its device fails only after the work started.
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"config key 'workers.device' expects auto, cpu, cuda or cuda:<i>, got {self.device!r}")
        if self.device.startswith("cuda") and self.num_gpus == 0:
            raise ConfigError(f"config key 'workers.device' is {self.device!r} but workers.num_gpus=0: an actor sees "
                              "a GPU only when it asks for one (set workers.num_gpus, or workers.device=auto)")


@dataclass
class ForecastWorkers(WorkersConfig):
    # 0: the batches run in the job's own process (no Ray); N: on N Ray actors, all writing one forecast.zarr
    # (out_dir must then be on a file system every actor's node sees)
    actors: NonNegInt = 0
