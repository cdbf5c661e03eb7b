"""`jobs/prepare_data.py` on Ray: a view's statistics tasks (one per variable and level) as Ray tasks.

    main = prepare_data_main      # wxray.prepare.stores.prepare_data_main with `ray_map` as its map

A copy (mode=copy) needs no Ray and starts none; a view with more than one field joins the cluster
(`ray_address`, RAY_ADDRESS under `ray job submit`) or starts a local one, and runs its tasks there, each
reading the source itself (s3fs / gcsfs on every node, credentials from the node's environment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from wxray.errors import DataError, WxrayError
from wxray.job import JobContext
from wxray.platform.cluster import session
from wxray.prepare.stores import PrepareDataConfig
from wxray.prepare.stores import prepare_data_main as data_main


def ray_map(fn: Callable[[dict], Any], jobs: list[dict]) -> Iterator[Any]:
    """`fn` over `jobs` as Ray tasks (one CPU each), results yielded as they finish; in this process when
    there is only one job."""
    if len(jobs) <= 1:
        yield from map(fn, jobs)
        return
    import ray

    session.ensure_ray(timeout_s=60.0)
    task = ray.remote(num_cpus=1, max_retries=2)(fn)
    pending = [task.remote(job) for job in jobs]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            yield ray.get(done[0])
        except ray.exceptions.RayTaskError as e:  # the task's own error, in one line
            for c in pending:
                ray.cancel(c)
            cause = getattr(e, "cause", None)
            if isinstance(cause, WxrayError):
                raise type(cause)(str(cause)) from None
            raise DataError(f"a statistics task failed: {str(cause or e).splitlines()[0]}") from None


def prepare_data_main(cfg: PrepareDataConfig, ctx: JobContext) -> dict[str, Any]:
    return data_main(cfg, ctx, map_fn=ray_map)
