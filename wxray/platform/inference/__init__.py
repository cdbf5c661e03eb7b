"""Forecasts from trained checkpoints: the forecast jobs, the chain loaded, the one nested-ensemble engine."""
