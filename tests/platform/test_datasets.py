"""Ray Data windows: sharding across Train workers covers every window (and every observation of the end-to-end
system's windows) exactly once per epoch."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.dataset as pads
import pytest

from wxray.data.e2e_windows import ObsDataConfig, prepare_e2e
from wxray.data.schema import open_store
from wxray.data.window_data import DataConfig
from wxray.data.windows import WindowReader
from wxray.platform.train.datasets import build_datasets, build_e2e_datasets, exactly_once_data_config


def _shard_loop(config):
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    windows, obs = ray.train.get_dataset_shard("train"), ray.train.get_dataset_shard("obs")
    for epoch in range(config["epochs"]):
        seen = {"windows": [], "obs": []}
        for batch in windows.iter_torch_batches(batch_size=3):
            assert batch["x"].shape[1:] == tuple(config["x_shape"])
            seen["windows"].extend(int(a) for a in batch["anchor"])
        for batch in obs.iter_torch_batches(batch_size=3):
            ids = batch["obs.stations.id"].numpy().ravel()
            seen["obs"].extend(int(i) for i in ids[ids >= 0])
        with open(f"{config['out']}/rank{rank}_epoch{epoch}.json", "w") as f:
            json.dump(seen, f)


@pytest.mark.slow
def test_two_workers_see_every_window_and_observation_exactly_once_per_epoch(ray_session, small_store, small_obs,
                                                                            tmp_path):
    """The grid windows of a store and the observation windows of the end-to-end system, in one Train run."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from tests.tiny_store import write_tiny_store

    path = tmp_path / "odd.zarr"
    write_tiny_store(path, n_traj=3, steps=11)
    cfg = DataConfig(store=str(path), generate_sample=False, history=2, lead_steps=1,
                     split_fractions=(1.0, 0.0, 0.0), read_batch_size=2)
    datasets, data = build_datasets(cfg)
    expected = {"windows": sorted(data.anchors["train"].tolist())}
    # 27 windows for 2 workers: an equal split (Ray Train's default) would have to drop one.
    assert len(expected["windows"]) == 3 * 9

    obs_cfg = ObsDataConfig(store=str(small_store), obs_dir=str(small_obs.obs_dir), history=1, lead_steps=1,
                            split_fractions=(1.0, 0.0, 0.0), read_batch_size=2)
    e2e = prepare_e2e(obs_cfg, patch_size=2)
    # every good station report at an analysis time of a training window (stations report at the store steps)
    times = open_store(small_store).time.values[e2e.windows.anchors["train"]]
    table = pads.dataset(small_obs.obs_dir / "points" / "stream=stations", partitioning="hive").to_table().to_pandas()
    expected["obs"] = sorted(table.obs_id[(table.quality == 0) & table.time.isin(times)].tolist())
    assert len(expected["obs"]) > 100

    out = tmp_path / "seen"
    out.mkdir()
    trainer = TorchTrainer(
        _shard_loop,
        train_loop_config={"epochs": 2, "out": str(out), "x_shape": [2 * 4 + 1, 8, 16]},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=str(tmp_path / "ray"), name="shards"),
        datasets={"train": datasets["train"], "obs": build_e2e_datasets(obs_cfg, e2e)["train"]},
        dataset_config=exactly_once_data_config(),
    )
    trainer.fit()
    for epoch in range(2):
        per_rank = [json.loads((out / f"rank{r}_epoch{epoch}.json").read_text()) for r in range(2)]
        for what in ("windows", "obs"):
            assert all(len(p[what]) > 0 for p in per_rank), f"both workers get {what}"
            together = per_rank[0][what] + per_rank[1][what]
            assert len(together) == len(set(together)), f"one of the {what} was read twice in one epoch"
            assert sorted(together) == expected[what], f"one of the {what} was skipped"


@pytest.mark.slow
def test_ray_pipeline_yields_same_windows_as_plain_reader(ray_session, tiny_store):
    path, _ = tiny_store
    cfg = DataConfig(store=str(path), generate_sample=False, history=2, lead_steps=1)
    datasets, data = build_datasets(cfg)
    rows = {int(r["anchor"]): r for r in datasets["val"].take_all()}
    assert sorted(rows) == sorted(data.anchors["val"].tolist())
    ref = WindowReader(data.spec)({"anchor": np.array(sorted(rows))})
    for i, a in enumerate(sorted(rows)):
        np.testing.assert_array_equal(rows[a]["x"], ref["x"][i])
        np.testing.assert_array_equal(rows[a]["y"], ref["y"][i])
