"""Training: the one loop and its tasks, the TorchTrainer driver, the training jobs, checkpoints, rollout."""
