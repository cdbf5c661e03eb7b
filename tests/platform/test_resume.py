"""Resuming a worker: the newest of Ray Train's checkpoint and the run's storage, each worker's copy its own."""

from __future__ import annotations

from pathlib import Path

from ray.train import Checkpoint

from wxray.data import location
from wxray.forecast import checkpoints
from wxray.platform.train.resume import newest_checkpoint


def test_a_resume_takes_the_newest_of_rays_checkpoint_and_the_runs_storage(tmp_path):
    """After a hard abort Ray Train's checkpoint manager may know only an older checkpoint than the newest in the
    run's storage: the loop resumes from whichever has the later step."""
    old = checkpoints.save(tmp_path / "checkpoint_a", {}, {"epoch": 1, "step": 4})
    new = checkpoints.save(tmp_path / "checkpoint_b", {}, {"epoch": 2, "step": 8})
    with newest_checkpoint(Checkpoint.from_directory(str(old)), str(new)) as d:
        assert d == new
    with newest_checkpoint(Checkpoint.from_directory(str(new)), str(old)) as d:
        assert Path(d) == new
    with newest_checkpoint(Checkpoint.from_directory(str(old)), str(tmp_path / "elsewhere")) as d:
        assert Path(d) == old  # a path this node cannot see: Ray's
    with newest_checkpoint(None, "") as d:
        assert d is None


def test_a_checkpoint_in_a_bucket_is_copied_for_each_worker_alone(s3_server, tmp_path):
    """Ray's as_directory() hands a node's workers one shared /tmp folder, emptied by the first to finish; a
    worker restarted later then read an empty folder. Each worker's resume copy is its own."""
    fs, _ = location.filesystem("s3://resume")
    fs.mkdir("resume")
    fs.put(str(checkpoints.save(tmp_path / "ckpt", {}, {"epoch": 1, "step": 4})), "resume/ckpt", recursive=True)
    arrow, path = location.arrow_filesystem("s3://resume/ckpt")
    ckpt = Checkpoint(path, filesystem=arrow)
    with newest_checkpoint(ckpt, "") as a:
        with newest_checkpoint(ckpt, "") as b:
            assert Path(a) != Path(b) and checkpoints.read_meta(b)["step"] == 4
        assert checkpoints.read_meta(a)["step"] == 4  # the other's copy gone, this one whole
    assert not Path(a).exists()
