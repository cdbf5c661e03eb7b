"""wxray: Ray-distributed training and ensemble inference for ML weather forecasting."""

__version__ = "0.1.0"
