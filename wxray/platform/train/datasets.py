"""Ray Datasets of training windows, read lazily from a zarr store in parallel read tasks.

Each split is a Ray Dataset of window anchors (a few bytes each, shuffled once with the config's seed)
followed by a `map_batches` read task that opens the store and reads, stacks and normalises the windows
(`data.windows.WindowReader`, or for the end-to-end stages `data.e2e_windows.E2EReader`). Train workers take
their share with `ray.train.get_dataset_shard(split)`.

Sharding guarantee (tested in tests/platform/test_datasets.py): Ray Train's default `DataConfig` splits
with `streaming_split(equal=True)`, which *drops* up to world_size-1 rows per epoch to equalise shards.
`ExactlyOnceDataConfig` splits with `equal=False` instead, so within one epoch every valid window goes to
exactly one worker: none is seen twice and none is skipped. Shards may then differ by a batch; the training
loop keeps the workers' collectives in lockstep by padding the shorter shard with zero-weight batches
(`loop.lockstep_batches`).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from wxray.data.anchors import SPLITS
from wxray.data.e2e_windows import E2EData, E2EReader, ObsDataConfig
from wxray.data.window_data import DataConfig, WindowData, prepare_windows
from wxray.data.windows import WindowReader, WindowSpec


def window_dataset(spec: WindowSpec, anchors: np.ndarray, read_batch_size: int = 4,
                   read_cpus: float = 0.25, num_blocks: int | None = None) -> Any:
    """A Ray Dataset yielding {"x", "y", "anchor"} rows for the given windows, in the given order."""
    import ray.data

    items = [{"anchor": int(a)} for a in anchors]
    # One read call per block: per-task overhead is paid once per `read_batch_size` windows.
    n_blocks = num_blocks or -(-len(items) // read_batch_size)
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(n_blocks, len(items) or 1)))
    # the reader itself is the batch function: a read task unpickles it and imports only wxray.data
    return ds.map_batches(WindowReader(spec), batch_size=read_batch_size,
                          batch_format="numpy", num_cpus=read_cpus)


def build_datasets(cfg: DataConfig, data: WindowData | None = None) -> tuple[dict[str, Any], WindowData]:
    """Ray Datasets for every non-empty split, plus the window index they were built from."""
    # Per-operator bars from every read task drown the training log; the loop prints its own progress.
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = cfg.progress_bars
    data = data or prepare_windows(cfg)
    datasets = {s: window_dataset(data.spec, data.anchors[s], cfg.read_batch_size, cfg.read_cpus)
                for s in SPLITS if len(data.anchors[s])}
    return datasets, data


def exactly_once_data_config(datasets_to_split: list[str] | str = "all"):
    """A Ray Train DataConfig whose shards together hold every row exactly once per epoch.

    A single worker holds every row: it iterates the dataset itself (as Ray Train does for a dataset it does
    not split), with no split-coordinator actor between it and the read tasks."""
    from ray.train import DataConfig as RayDataConfig

    class ExactlyOnceDataConfig(RayDataConfig):
        def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
            output = [{} for _ in range(world_size)]
            names = set(datasets) if self._datasets_to_split == "all" else set(self._datasets_to_split)
            for name, ds in datasets.items():
                ds = ds.copy(ds)
                ds.context.execution_options = copy.deepcopy(self._resolve_execution_options(name))
                if name in names and world_size > 1:
                    for i, split in enumerate(ds.streaming_split(world_size, equal=False)):
                        output[i][name] = split
                else:
                    for i in range(world_size):
                        output[i][name] = ds.iterator()
            return output

    return ExactlyOnceDataConfig(datasets_to_split=datasets_to_split)


def e2e_dataset(data: E2EData, anchors: np.ndarray, read_batch_size: int = 8, read_cpus: float = 0.25) -> Any:
    import ray.data

    items = [{"anchor": int(a)} for a in anchors]
    n_blocks = max(1, min(-(-len(items) // read_batch_size), len(items) or 1))
    ds = ray.data.from_items(items, override_num_blocks=n_blocks)
    return ds.map_batches(E2EReader(data.spec, data.obs),
                          batch_size=read_batch_size, batch_format="numpy", num_cpus=read_cpus)


def build_e2e_datasets(cfg: ObsDataConfig, data: E2EData) -> dict[str, Any]:
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = cfg.progress_bars
    return {s: e2e_dataset(data, data.windows.anchors[s], cfg.read_batch_size, cfg.read_cpus)
            for s in SPLITS if len(data.windows.anchors[s])}

