"""Training on Ray Train: the one loop and its hooks, the tasks, the TorchTrainer driver, the training jobs."""
