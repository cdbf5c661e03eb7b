"""Geometry of the synthetic observing system (`wxray.data.obs.sample`): where and when it observes.

* `bilinear`: a store field at arbitrary (time index, latitude, longitude) points, bilinear in latitude
  (ascending, any spacing; clamped to the grid's rows) and longitude (a global regular grid, wrapped: a point at
  359 deg lies between the last meridian and 0 deg).
* `place_stations`: fixed sites at uneven density: a share inside a few 'continent' boxes (dense), the rest
  spread uniformly over the rest of the sphere (sparse).
* `ship_tracks`: moving platforms that wander the sparse regions (turning back at the boxes and at 65 deg).
* `swath_mask`: polar-orbiting satellites (inclination 98.7 deg, 14.2 orbits a day, the Earth turning under
  them): a pixel is seen in a step when it lies within the half-width of the ground track of an orbit flown
  in that step; the orbits flown advance from step to step, so the swaths move.
"""

from __future__ import annotations

import numpy as np

# (south, north, west, east) degrees; lon in [0, 360): dense 'continents' (North America, Europe, East Asia)
CONTINENTS = ((25.0, 60.0, 235.0, 290.0), (35.0, 65.0, 0.0, 40.0), (20.0, 50.0, 100.0, 140.0))
EARTH_KM = 6371.0
ORBITS_PER_DAY = 14.2
INCLINATION_DEG = 98.7


def in_boxes(lat: np.ndarray, lon: np.ndarray, boxes=CONTINENTS) -> np.ndarray:
    lat, lon = np.asarray(lat), np.mod(np.asarray(lon), 360.0)
    inside = np.zeros(lat.shape, dtype=bool)
    for s, n, w, e in boxes:
        inside |= (lat >= s) & (lat <= n) & (lon >= w) & (lon <= e)
    return inside


def orography(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """A smooth terrain height (m): one Gaussian mountain range per continent box (peak 2000 m, e-folding a
    quarter of the box), zero over the sparse regions. Station altitudes follow it, so what a station sees
    that the grid does not (`sample._representativeness`) is a function of where it is."""
    lat, lon = np.asarray(lat, np.float64), np.mod(np.asarray(lon, np.float64), 360.0)
    h = np.zeros(lat.shape)
    for s, n, w, e in CONTINENTS:
        clat, clon = (s + n) / 2, (w + e) / 2
        dlat, dlon = (lat - clat) / ((n - s) / 4), (np.mod(lon - clon + 180, 360) - 180) / ((e - w) / 4)
        h += 2000.0 * np.exp(-0.5 * (dlat ** 2 + dlon ** 2))
    return h


def box_area(box) -> float:
    """Solid angle (steradians) of a lat/lon box."""
    s, n, w, e = box
    return float(np.radians(e - w) * (np.sin(np.radians(n)) - np.sin(np.radians(s))))


def uniform_sphere(rng: np.random.Generator, n: int, max_lat: float = 90.0) -> tuple[np.ndarray, np.ndarray]:
    """n points uniform in area between -max_lat and max_lat."""
    z = rng.uniform(-np.sin(np.radians(max_lat)), np.sin(np.radians(max_lat)), n)
    return np.degrees(np.arcsin(z)), rng.uniform(0.0, 360.0, n)


def sample_in_box(rng: np.random.Generator, box, n: int) -> tuple[np.ndarray, np.ndarray]:
    s, nn, w, e = box
    z = rng.uniform(np.sin(np.radians(s)), np.sin(np.radians(nn)), n)
    return np.degrees(np.arcsin(z)), rng.uniform(w, e, n)


def sample_outside(rng: np.random.Generator, n: int, max_lat: float) -> tuple[np.ndarray, np.ndarray]:
    """n points uniform in area over |lat| <= max_lat outside the continent boxes (rejection sampling)."""
    lats, lons = np.empty(0), np.empty(0)
    while lats.size < n:
        la, lo = uniform_sphere(rng, 2 * (n - lats.size) + 8, max_lat)
        keep = ~in_boxes(la, lo)
        lats, lons = np.r_[lats, la[keep]], np.r_[lons, lo[keep]]
    return lats[:n], lons[:n]


def place_stations(rng: np.random.Generator, n: int, dense_share: float = 0.75,
                   max_lat: float = 80.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lat, lon, in_box) of n sites: `dense_share` of them in the boxes (by box area), the rest sparse."""
    n_dense = int(round(dense_share * n))
    areas = np.array([box_area(b) for b in CONTINENTS])
    per_box = np.floor(n_dense * areas / areas.sum()).astype(int)
    per_box[: n_dense - per_box.sum()] += 1
    lat, lon = [], []
    for box, k in zip(CONTINENTS, per_box):
        a, b = sample_in_box(rng, box, int(k))
        lat.append(a)
        lon.append(b)
    a, b = sample_outside(rng, n - n_dense, max_lat)
    lat, lon = np.concatenate(lat + [a]), np.concatenate(lon + [b])
    return lat, np.mod(lon, 360.0), in_boxes(lat, lon)


def ship_tracks(rng: np.random.Generator, n_ships: int, n_steps: int, step_hours: float,
                speed_kmh: tuple[float, float] = (12.0, 28.0), max_lat: float = 65.0) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lon), each (n_steps, n_ships): positions at the store times of ships sailing the sparse regions.

    Each ship keeps its own speed; its heading random-walks (15 deg a step) and turns about when the next
    position would enter a continent box or pass `max_lat`."""
    lat = np.empty((n_steps, n_ships))
    lon = np.empty((n_steps, n_ships))
    lat[0], lon[0] = sample_outside(rng, n_ships, max_lat - 5.0)
    speed = rng.uniform(*speed_kmh, n_ships)
    heading = rng.uniform(0, 2 * np.pi, n_ships)
    dist = speed * step_hours / EARTH_KM  # radians per step
    for k in range(1, n_steps):
        heading = heading + np.radians(15.0) * rng.standard_normal(n_ships)
        la, lo = _advance(lat[k - 1], lon[k - 1], heading, dist)
        bad = in_boxes(la, lo) | (np.abs(la) > max_lat)
        for _ in range(4):  # turn about (with a random swerve) until the move stays at sea
            if not bad.any():
                break
            heading[bad] = heading[bad] + np.pi + rng.uniform(-0.5, 0.5, bad.sum())
            la[bad], lo[bad] = _advance(lat[k - 1][bad], lon[k - 1][bad], heading[bad], dist[bad])
            bad = in_boxes(la, lo) | (np.abs(la) > max_lat)
        la[bad], lo[bad] = lat[k - 1][bad], lon[k - 1][bad]  # still blocked: heave to for a step
        lat[k], lon[k] = la, lo
    return lat, lon


def _advance(lat, lon, heading, dist):
    """Great-circle move by `dist` radians along `heading` (radians clockwise from north)."""
    p1, l1 = np.radians(lat), np.radians(lon)
    p2 = np.arcsin(np.clip(np.sin(p1) * np.cos(dist) + np.cos(p1) * np.sin(dist) * np.cos(heading), -1, 1))
    l2 = l1 + np.arctan2(np.sin(heading) * np.sin(dist) * np.cos(p1), np.cos(dist) - np.sin(p1) * np.sin(p2))
    return np.degrees(p2), np.mod(np.degrees(l2), 360.0)


def between(lat0, lon0, lat1, lon1, f):
    """Linear interpolation from (lat0, lon0) towards (lat1, lon1) by fraction f, the short way round in lon."""
    dlon = np.mod(np.asarray(lon1) - lon0 + 180.0, 360.0) - 180.0
    return lat0 + f * (np.asarray(lat1) - lat0), np.mod(lon0 + f * dlon, 360.0)


def swath_mask(lat: np.ndarray, lon: np.ndarray, n_steps: int, step_hours: float, half_width_deg: float,
               node0_deg: float = 0.0, phase: float = 0.0) -> np.ndarray:
    """(n_steps, h, w) bool: the pixels of the grid (lat, lon) a polar orbiter sees in each step.

    Orbit o (o = 0, 1, ...; `phase` shifts the count) has its ascending node at node0 - o * 360 / 14.2 deg
    (the Earth turns under the orbit plane); its ground track is the great circle with normal
    n_o = (sin i sin L, -sin i cos L, cos i). Step k flies the orbits with floor(k r + phase) <= o <
    floor((k + 1) r + phase), r = orbits per step; a pixel x is in the swath of orbit o when |x . n_o| <=
    sin(half width)."""
    la, lo = np.meshgrid(np.radians(lat), np.radians(lon), indexing="ij")
    x = np.stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)], -1)  # (h, w, 3)
    inc = np.radians(INCLINATION_DEG)
    per_step = ORBITS_PER_DAY * step_hours / 24.0
    limit = np.sin(np.radians(half_width_deg))
    out = np.zeros((n_steps, len(lat), len(lon)), dtype=bool)
    for k in range(n_steps):
        for o in range(int(np.floor(k * per_step + phase)), int(np.floor((k + 1) * per_step + phase))):
            node = np.radians(node0_deg - o * 360.0 / ORBITS_PER_DAY)
            n = np.array([np.sin(inc) * np.sin(node), -np.sin(inc) * np.cos(node), np.cos(inc)])
            out[k] |= np.abs(x @ n) <= limit
    return out


def bilinear(field: np.ndarray, grid_lat: np.ndarray, grid_lon: np.ndarray, t: np.ndarray, lat: np.ndarray,
             lon: np.ndarray) -> np.ndarray:
    """field[t, lat, lon] (float64) for points; field (T, h, w) on an ascending latitude axis and a global
    regular longitude axis starting at grid_lon[0]."""
    grid_lat = np.asarray(grid_lat, dtype=np.float64)
    h, w = field.shape[1:]
    lat = np.clip(np.asarray(lat, dtype=np.float64), grid_lat[0], grid_lat[-1])
    i = np.clip(np.searchsorted(grid_lat, lat, side="right") - 1, 0, h - 2)
    wy = np.clip((lat - grid_lat[i]) / (grid_lat[i + 1] - grid_lat[i]), 0.0, 1.0)
    xf = np.mod(np.asarray(lon, dtype=np.float64) - float(grid_lon[0]), 360.0) / (360.0 / w)
    j = np.floor(xf).astype(np.int64) % w
    wx = xf - np.floor(xf)
    j1 = (j + 1) % w
    f = field
    return ((1 - wy) * ((1 - wx) * f[t, i, j] + wx * f[t, i, j1])
            + wy * ((1 - wx) * f[t, i + 1, j] + wx * f[t, i + 1, j1]))
