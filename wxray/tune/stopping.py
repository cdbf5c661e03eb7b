"""ASHA that asks trials to stop instead of killing them.

Tune stops a trial by killing its actor; under Ray Train V2 the trial's worker-group placement group
outlives that actor (ray-project/ray#54305), so on a small cluster the next trial waits forever for its
workers. Here the scheduler only decides: after each epoch report it writes the ASHA decision to

    <sweep dir>/trials/<trial id>/.decisions/<epochs completed>      ("CONTINUE" or "STOP")

and tells Tune to continue. The training loop waits for that file after each epoch
(`reporting.stop_requested`),
ends the run cleanly on STOP (its checkpoint of that epoch is the trial's last), and Train releases its
workers. An early-stopped trial is then one that ran fewer epochs than configured.

ASHA's rungs (the reward each trial reached at each milestone) are written to `<sweep dir>/asha_rungs.json`
after every result and read back when the sweep is restored: Tune restores no scheduler state, and without
its rungs a restored sweep would judge the remaining trials against each other only, not against the
trials finished before the interruption.
"""

from __future__ import annotations

import json
from pathlib import Path

from wxray.platform.train.reporting import CONTINUE, STOP

DECISIONS = ".decisions"
RUNGS = "asha_rungs.json"


def decisions_dir(sweep_dir: str | Path, trial_id: str) -> Path:
    return Path(sweep_dir) / "trials" / trial_id / DECISIONS


def cooperative_asha(sweep_dir: str | Path, **kwargs):
    """An ASHAScheduler (same arguments) whose STOP reaches the trial as a decision file, and whose rungs
    outlive the sweep's driver (`<sweep_dir>/asha_rungs.json`)."""
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    rungs_file = Path(sweep_dir) / RUNGS

    class CooperativeASHA(ASHAScheduler):
        def on_trial_add(self, tune_controller, trial):
            # A restored sweep unpickles this scheduler as it was when the sweep began: empty rungs.
            if rungs_file.exists() and not any(recorded for b in self._brackets for _, recorded in b._rungs):
                for bracket, saved in zip(self._brackets, json.loads(rungs_file.read_text())):
                    for (_, recorded), (_, rewards) in zip(bracket._rungs, saved):
                        recorded.update(rewards)
            super().on_trial_add(tune_controller, trial)

        def _save_rungs(self) -> None:
            tmp = rungs_file.with_suffix(".tmp")
            tmp.write_text(json.dumps([[[m, r] for m, r in b._rungs] for b in self._brackets]))
            tmp.replace(rungs_file)

        def on_trial_complete(self, tune_controller, trial, result):
            super().on_trial_complete(tune_controller, trial, result)
            self._save_rungs()

        def on_trial_result(self, tune_controller, trial, result):
            action = super().on_trial_result(tune_controller, trial, result)
            self._save_rungs()
            epoch = int(result.get("epoch", 0))
            if epoch:
                folder = decisions_dir(trial.config["sweep_dir"], trial.trial_id)
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f".{epoch}.tmp"
                tmp.write_text(STOP if action == TrialScheduler.STOP else CONTINUE)
                tmp.replace(folder / str(epoch))
            return TrialScheduler.CONTINUE

    return CooperativeASHA(**kwargs)
