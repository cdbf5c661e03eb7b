"""A scorecard in a few lines for the console, before RESULT: per channel the digest's score (`Metric.digest`: the
CRPS of an ensemble, the RMSE of a one-member forecast) at the first and last lead in the variable's units and,
with a baseline, the relative difference there and at how many leads the forecast is significantly better or
worse. RESULT and the files keep every figure; this is for reading."""

from __future__ import annotations

import numpy as np
import xarray as xr

from wxray.data.schema import LEAD
from wxray.verify import metrics
from wxray.verify.units import pretty_units


def _number(v: float) -> str:
    return f"{v:.4g}" if np.isfinite(v) else "n/a"


def digest(card: xr.Dataset) -> list[str]:
    """The lines (without the 'wxray: ' prefix) of the module docstring."""
    one_member = int(card.attrs.get("n_members", 1)) <= 1  # a one-member CRPS is the MAE: not shown as a CRPS
    ranked = [m for m in metrics.by_name().values() if m.digest and not (one_member and m.one_member_alias)]
    if not ranked:
        return []
    metric = max(ranked, key=lambda m: m.digest).name
    if metric not in card["metric"].values:
        return []
    hours = card[LEAD].values / np.timedelta64(1, "h")
    ends = sorted({0, len(hours) - 1})
    span = " -> ".join(f"{hours[j]:g} h" for j in ends)
    compared = "rel_diff" in card
    lines = [f"{metric.upper()} at {span} over {int(card['n_init'].min())} initialisations"
             + (f"; vs {card.attrs.get('baseline', 'the baseline')} (negative: better)" if compared else "")]
    width = max(len(str(c)) for c in card["channel"].values)
    for ch in card["channel"].values:
        values = card["value"].sel(channel=ch, metric=metric).values
        units = pretty_units(str(card["units"].sel(channel=ch).item())) if "units" in card.coords else ""
        text = f"  {str(ch):<{width}}  {' -> '.join(_number(values[j]) for j in ends)} {units}".rstrip()
        if compared:
            rel = 100 * card["rel_diff"].sel(channel=ch, metric=metric).values
            sig = card["significant"].sel(channel=ch, metric=metric).values == 1
            better = int((sig & (rel < 0)).sum())
            worse = int((sig & (rel > 0)).sum())
            text += (f"   {' -> '.join(f'{rel[j]:+.2f}%' for j in ends)}"
                     f"   significantly better at {better}/{len(hours)} leads, worse at {worse}")
        lines.append(text)
    return lines
