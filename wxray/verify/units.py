"""Units as figures show them: CF strings with exponents as superscripts ('m**2 s**-2' -> 'm² s⁻²'), squared
for variances, nothing for dimensionless scores. Data and files keep the CF strings; only labels change."""

from __future__ import annotations

import re

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def pretty_units(units: str) -> str:
    """CF units with exponents as superscripts: 'm**2 s**-2' -> 'm² s⁻²', 'm s-1' -> 'm s⁻¹', '1' -> ''."""
    units = units.strip()
    if units in ("", "1", "dimensionless"):
        return ""
    text = re.sub(r"\*\*(-?\d+)", lambda m: m.group(1).translate(_SUPERSCRIPT), units)
    return re.sub(r"(?<=[A-Za-z])(-?\d+)\b", lambda m: m.group(1).translate(_SUPERSCRIPT), text)


def units_label(units: str, power: int = 1) -> str:
    """'[m s⁻¹]'; '[(m s⁻¹)²]' for a squared quantity (a variance); '' for none."""
    shown = pretty_units(units)
    if not shown or power == 1:
        return f"[{shown}]" if shown else ""
    return f"[({shown}){str(power).translate(_SUPERSCRIPT)}]"
