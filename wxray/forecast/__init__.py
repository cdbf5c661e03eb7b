"""Forecasts from trained models, without Ray: the checkpoint format, rollout, the end-to-end state stepping and
the chain loaded for inference, the one nested-ensemble engine and its seed scheme, the forecast jobs."""
