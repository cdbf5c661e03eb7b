"""The forecast tests' store (forecast_helpers.write_forecast_store), written once per test module."""

from __future__ import annotations

import pytest

from tests.forecast.forecast_helpers import write_forecast_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_forecast_store(tmp_path_factory.mktemp("fc") / "odd.zarr")
