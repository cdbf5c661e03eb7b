"""How MLflow's web UI opens a wxray experiment: on the runs table, with the job's headline metrics as columns.

MLflow 3's UI (3.17) does not follow the experiment's `mlflow.experimentKind` tag when it picks its mode: a
sidebar toggle kept in the browser's localStorage (`mlflow.workflowType_v1`, GenAI unless the user switched
it) decides, and a first-time visitor lands on the GenAI overview (traces, latency, a "Detect Issues" pop-up);
`wxray.tracking_ui`, the app `make mlflow-ui` serves, defaults it to model training. The UI's own deep links
override it: `?workflowType=machine_learning` on the experiment's route. Its runs
table starts without metric columns; a *shared view* (the experiment tag `mlflow.sharedViewState.<key>`,
opened with `?viewStateShareKey=<key>`) carries the columns to show. wxray writes that tag per experiment and
prints links with both parameters (`experiment_url`, `run_url`); `make mlflow-ui` prints one per experiment.

The columns come from what a finished run logged, chosen by the job's patterns (`JobConfig.columns`), merged
with those other jobs of the experiment showed before (at most MAX_COLUMNS).
"""

from __future__ import annotations

import fnmatch
import json
import sys
from collections.abc import Iterable

VIEW_KEY = "wxray"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
ML_MODE = "workflowType=machine_learning"
MAX_COLUMNS = 16
# The runs table's own search state, as the UI writes it when it shares a view: newest runs first, all of them.
SEARCH_STATE = {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
                "lifecycleFilter": "Active", "modelVersionFilter": "All Runs", "datasetsFilter": []}


def column(metric: str) -> str:
    """The runs table's key of a metric column (the UI quotes names with dots, slashes or spaces)."""
    return "metrics.`" + metric.replace("`", "``") + "`"


def chosen(metrics: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The metrics matching `patterns` (fnmatch), in the patterns' order, each once."""
    names, out = sorted(metrics), []
    for pattern in patterns:
        out += [m for m in names if fnmatch.fnmatchcase(m, pattern) and m not in out]
    return out


def view_state(current: str | None, metrics: list[str]) -> str | None:
    """The shared view's JSON with `metrics` as columns after those it shows already; None when unchanged."""
    try:
        state = json.loads(current) if current else None
    except ValueError:
        state = None
    valid = isinstance(state, dict)
    state = state if valid else {}
    columns = [c for c in state.get("selectedColumns", []) if isinstance(c, str)]
    merged = (columns + [c for c in map(column, metrics) if c not in columns])[:MAX_COLUMNS]
    if valid and merged == columns:
        return None
    return json.dumps({**SEARCH_STATE, **state, "selectedColumns": merged})


def experiment_url(base: str, experiment_id: str) -> str:
    """The experiment's runs table, in model-training mode, with wxray's columns."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}&{ML_MODE}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{ML_MODE}"


def show_columns(client, experiment_id: str, run_id: str, patterns: Iterable[str]) -> None:
    """Add the metrics `run_id` logged that match `patterns` to its experiment's shared view."""
    patterns = list(patterns)
    if not patterns:
        return
    metrics = chosen(client.get_run(run_id).data.metrics, patterns)
    current = client.get_experiment(experiment_id).tags.get(VIEW_TAG)
    state = view_state(current, metrics)
    if state is not None:
        client.set_experiment_tag(experiment_id, VIEW_TAG, state)


def main(argv: list[str]) -> int:
    """`python -m wxray.tracking_view <tracking uri> <UI address>`: one link per wxray experiment."""
    import mlflow

    uri, base = argv
    experiments = [e for e in mlflow.MlflowClient(uri).search_experiments() if e.name.startswith("wxray")]
    for e in sorted(experiments, key=lambda e: e.name):
        print(f"  {e.name:<18} {experiment_url(base, e.experiment_id)}")
    if not experiments:
        print("  (no wxray experiments yet: run a job first, e.g. make demo)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
