"""The training loop's hooks, each on its own, on a stand-in for a worker's run (no Ray): the points they are
called at, what they log and print, and when they stop the run. The whole loop on Ray Train runs in
test_trainer.py (Ctrl-C), test_storage.py and test_elastic.py (the fault drill, checkpoints, restarts) and
tests/tune/test_sweep.py (the sweep's stop)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from wxray.platform.train import hooks
from wxray.platform.train.loop import _batch_starts
from wxray.platform.train.worker import StepOut


class Recorder(hooks.Hook):
    def __init__(self, name: str, calls: list, stop_at: int | None = None):
        self.name, self.calls, self.stop_at = name, calls, stop_at

    def on_train_batch_start(self, run) -> None:
        self.calls.append((self.name, run.step))
        if run.step == self.stop_at:
            run.stopped = True


def stand_in(**kw) -> SimpleNamespace:
    """The parts of a `worker.WorkerRun` the hooks read."""
    said: list[str] = []
    logged: list[tuple[dict, int]] = []
    train = SimpleNamespace(epochs=3, fault_drill_epoch=None, log_every=2, checkpoint_every=1)
    run = SimpleNamespace(rank=0, world=1, device=torch.device("cpu"), epoch=0, batch=0, step=0, seen=0,
                          stopped=False, meter=None, last=None, label="", cfg=SimpleNamespace(train=train),
                          model=torch.nn.Linear(2, 2), graph=None, val_shard=None, said=said, logged=logged,
                          reporter=SimpleNamespace(log=lambda m, step: logged.append((m, step))),
                          setup=SimpleNamespace(stop=None, out_dir="", identity={}, meta={}, decisions=""))
    run.say = said.append
    for k, v in kw.items():
        setattr(run, k, v)
    return run


def test_a_hook_that_stops_the_run_ends_the_batch_there():
    calls: list = []
    chain = [Recorder("first", calls, stop_at=1), Recorder("second", calls)]
    run = stand_in()
    assert _batch_starts(chain, run)
    run.step = 1
    assert not _batch_starts(chain, run) and run.stopped
    assert calls == [("first", 0), ("second", 0), ("first", 1)]  # the second is not called once stopped


def test_the_default_hooks_in_calling_order():
    run = stand_in()
    assert [type(h).__name__ for h in hooks.default_hooks(run)] == [
        "Interruption", "FaultDrill", "StepMetrics", "Console", "Report"]
    run.val_shard, run.setup.decisions = object(), "decisions"
    assert [type(h).__name__ for h in hooks.default_hooks(run)] == [
        "Interruption", "FaultDrill", "StepMetrics", "Validation", "Console", "Report", "SweepStop"]


def test_step_metrics_every_log_every_steps_and_the_epochs_largest():
    run = stand_in()
    metrics = hooks.StepMetrics(log_every=2, model=run.model, captured=False)
    metrics.on_train_epoch_start(run)
    for step in range(4):
        run.step = step
        metrics.on_train_batch_start(run)
        assert (run.meter is not None) == (step % 2 == 0)
        if run.meter is not None:
            run.meter.bytes = 100 * (step + 1)
        run.step += 1  # as the step does
        run.last = StepOut(torch.tensor(2.0), torch.tensor(0.5), w=0.5, n=4, lr=1e-3)
        metrics.on_train_batch_end(run)
    assert [step for _, step in run.logged] == [1, 3]  # logged at the step count after the measured step
    first = run.logged[0][0]
    assert first["train/loss"] == 4.0 and first["train/selector_loss"] == 0.5 and first["train/lr"] == 1e-3
    assert first["train/saved_activation_bytes"] == 100 and first["train/samples_per_s_per_worker"] > 0
    epoch: dict = {}
    metrics.on_train_epoch_end(run, epoch)
    assert epoch == {"train/epoch_saved_activation_bytes": 300}  # the largest of the epoch; no device peak on a CPU


def test_console_prints_one_line_per_epoch_with_the_validation_loss_when_there_is_one():
    run = stand_in(epoch=1, step=26, label="encoder ")
    hooks.Console().on_train_epoch_end(run, {"train/epoch_loss": 0.84451, "val/loss": 0.8617,
                                             "train/epoch_samples_per_s_per_worker": 32.25})
    hooks.Console().on_train_epoch_end(run, {"train/epoch_loss": 1.0, "train/epoch_samples_per_s_per_worker": 2})
    assert run.said == ["encoder epoch 2/3: step 26, train loss 0.8445, val loss 0.8617, 32.2 samples/s/worker",
                        "encoder epoch 2/3: step 26, train loss 1.0000, 2.0 samples/s/worker"]


@pytest.mark.parametrize("epoch, newest", [(0, "none"), (2, "after epoch 2")])
def test_interruption_stops_at_the_next_step_and_names_the_newest_checkpoint(epoch, newest):
    flag = SimpleNamespace(is_set=lambda: True)
    run = stand_in(epoch=epoch, step=7)
    hook = hooks.Interruption(flag, rank=0, world=1)
    hook.on_train_batch_start(run)
    assert run.stopped and run.said == [f"stopped in epoch {epoch + 1} at step 7: the newest checkpoint is {newest}"]
    quiet = stand_in()
    hooks.Interruption(None, rank=0, world=1).on_train_batch_start(quiet)  # no flag (a sweep's trial): never
    assert not quiet.stopped


def test_the_fault_drill_fires_once_at_the_second_step_of_its_epoch(tmp_path, monkeypatch):
    exits = []
    monkeypatch.setattr(hooks.os, "_exit", exits.append)
    drill = hooks.FaultDrill(epoch=1, out_dir=str(tmp_path))
    for epoch, batch, world, rank in ((0, 1, 2, 1), (1, 0, 2, 1), (1, 1, 2, 0), (1, 1, 2, 1), (1, 1, 2, 1)):
        drill.on_train_batch_start(stand_in(epoch=epoch, batch=batch, world=world, rank=rank))
    assert exits == [1]  # rank 1 of two, epoch 1, its second step; not again once the marker is written
    assert (tmp_path / ".fault_drill_done").read_text() == "killed rank 1 at the start of epoch 1\n"
