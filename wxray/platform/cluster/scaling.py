"""How many Ray Train workers a run takes, of which devices and vendor (`scaling.*`): the config alone.

Where they may run is `placement.py`'s business, what Ray is asked for `resources.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wxray.config import PosFloat, PosInt
from wxray.errors import ConfigError

Vendor = Literal["nvidia", "amd", "any"]


@dataclass
class ScalingCfg:
    # Ray Train workers (one process group; FSDP2 shards across them). [min, max]: elastic, the run starts once
    # min fit and resizes (from its latest checkpoint) as workers are lost or free up; needs train.max_failures.
    num_workers: PosInt | tuple[PosInt, PosInt] = 1
    use_gpu: bool = False  # scaling.gpus_per_worker GPUs per worker (NVIDIA or AMD ROCm)
    cpus_per_worker: PosFloat = 1.0  # CPUs reserved per worker (also its torch threads on CPU)
    accelerator_type: str = ""  # e.g. "H100", "A100", "AMD-Instinct-MI250X"; "" = any
    # GPU vendor of every worker (one process group never mixes NCCL and RCCL); any: at start, the vendor with
    # enough GPUs and the most free (the run's config then records it). Nodes name theirs by the wxray.io/vendor
    # label or the nvidia/amd resource (cluster.yaml, cluster/slurm).
    vendor: Vendor = "any"
    gpus_per_worker: PosInt = 1  # GPUs reserved per worker (the loop trains on the first)
    resize_interval_s: PosFloat = 60.0  # elastic runs: how often a healthy run looks for room to grow

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, (tuple, list))

    @property
    def min_workers(self) -> int:
        return int(self.num_workers[0]) if self.elastic else int(self.num_workers)

    @property
    def max_workers(self) -> int:
        return int(self.num_workers[1]) if self.elastic else int(self.num_workers)

    def describe(self) -> str:
        return f"{self.min_workers}-{self.max_workers} workers (elastic)" if self.elastic else \
            f"{self.num_workers} worker(s)"

    def validate(self) -> None:
        if self.elastic:
            self.num_workers = tuple(self.num_workers)
            if self.min_workers > self.max_workers:
                raise ConfigError(f"scaling.num_workers={list(self.num_workers)}: expected [min, max] with "
                                  f"min <= max")
        if not self.use_gpu:
            for key, default in (("accelerator_type", ""), ("vendor", "any"), ("gpus_per_worker", 1)):
                if getattr(self, key) != default:
                    raise ConfigError(f"scaling.{key} is set but scaling.use_gpu=false")
        amd_type = self.accelerator_type.startswith("AMD-")
        if self.accelerator_type and self.vendor != "any" and amd_type != (self.vendor == "amd"):
            raise ConfigError(f"scaling.accelerator_type={self.accelerator_type!r} is "
                              f"{'an AMD' if amd_type else 'not an AMD'} type but scaling.vendor={self.vendor}")
