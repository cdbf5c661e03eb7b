"""Verification: WeatherBench 2 style scores over xarray with named dims, and their statistics.

No Ray here: these are plain functions over per-lead fields and per-initialisation score series, so
the same code scores a forecast on a laptop or inside a Ray task.
"""

from wxray.data.schema import MEMBER
from wxray.verify.anova import (
    MOMENT,
    MOMENTS,
    ROUTING_DRAW,
    empty_moments,
    group_moments,
    merge_moments,
    moments_anova,
    nested_anova3,
    nested_split,
)
from wxray.verify.deterministic import acc, bias, climatology_at, mae, mse, rmse, ssim
from wxray.verify.ensemble import (
    DROPOUT_DRAW,
    ENCODER_DRAW,
    MEMBER_DIMS,
    branch_spread_skill,
    crps,
    crps_ecdf,
    crps_fair,
    crps_field,
    crps_field_nested,
    ensemble_mean,
    ensemble_mean_rmse,
    ensemble_size,
    ensemble_variance,
    finite_size_factor,
    flatten_members,
    nested_anova,
    nested_finite_factors,
    nested_spread_skill,
    rank_histogram,
    spread,
    spread_skill_from_means,
    spread_skill_ratio,
)
from wxray.verify.forecasts import open_forecast, open_truth, persistence_forecast, regrid_like, truth_at
from wxray.verify.inference import (
    bartlett_long_run_variance,
    block_bootstrap,
    circular_block_indices,
    correlation_length,
    diebold_mariano,
    lag1_autocorrelation,
    wilks_block_length,
)
from wxray.verify.spatial import REGIONS, Region, latitude_weights, region_mask, spatial_mean
from wxray.verify.station_truth import pair_with_truth, read_station_truth
from wxray.verify.stations import (
    bilinear_at_points,
    read_station_forecasts,
    station_forecasts_from_grid,
    station_report,
    station_scores,
)

__all__ = [
    "DROPOUT_DRAW", "ENCODER_DRAW", "MEMBER", "MEMBER_DIMS", "MOMENT", "MOMENTS", "REGIONS", "ROUTING_DRAW", "Region",
    "acc", "bartlett_long_run_variance", "bias", "bilinear_at_points", "block_bootstrap", "branch_spread_skill",
    "circular_block_indices", "climatology_at", "correlation_length", "crps", "crps_ecdf", "crps_fair",
    "crps_field", "crps_field_nested", "diebold_mariano", "empty_moments", "ensemble_mean", "ensemble_mean_rmse",
    "ensemble_size",
    "ensemble_variance", "finite_size_factor", "flatten_members", "group_moments", "lag1_autocorrelation",
    "latitude_weights", "mae", "merge_moments", "moments_anova", "mse", "nested_anova", "nested_anova3",
    "nested_finite_factors", "nested_split", "nested_spread_skill", "open_forecast", "open_truth",
    "pair_with_truth", "persistence_forecast", "rank_histogram", "read_station_forecasts", "read_station_truth",
    "region_mask", "regrid_like", "rmse", "spatial_mean", "spread", "spread_skill_from_means",
    "spread_skill_ratio", "ssim", "station_forecasts_from_grid", "station_report", "station_scores", "truth_at",
    "wilks_block_length",
]
