"""ASHA that asks trials to stop instead of killing them.

Tune stops a trial by killing its actor; under Ray Train V2 the trial's worker-group placement group
outlives that actor (ray-project/ray#54305), so on a small cluster the next trial waits forever for its
workers. Here the scheduler only decides: after each epoch report it writes the ASHA decision to

    <sweep dir>/trials/<trial id>/.decisions/<epochs completed>      ("CONTINUE" or "STOP")

and tells Tune to continue. The training loop waits for that file after each epoch
(`reporting.stop_requested`),
ends the run cleanly on STOP (its checkpoint of that epoch is the trial's last), and Train releases its
workers. An early-stopped trial is then one that ran fewer epochs than configured.
"""

from __future__ import annotations

from pathlib import Path

from wxray.platform.train.reporting import CONTINUE, STOP

DECISIONS = ".decisions"


def decisions_dir(sweep_dir: str | Path, trial_id: str) -> Path:
    return Path(sweep_dir) / "trials" / trial_id / DECISIONS


def cooperative_asha(**kwargs):
    """An ASHAScheduler (same arguments) whose STOP reaches the trial as a decision file."""
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    class CooperativeASHA(ASHAScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            action = super().on_trial_result(tune_controller, trial, result)
            epoch = int(result.get("epoch", 0))
            if epoch:
                folder = decisions_dir(trial.config["sweep_dir"], trial.trial_id)
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f".{epoch}.tmp"
                tmp.write_text(STOP if action == TrialScheduler.STOP else CONTINUE)
                tmp.replace(folder / str(epoch))
            return TrialScheduler.CONTINUE

    return CooperativeASHA(**kwargs)
