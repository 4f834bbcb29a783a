"""GNSS -> local metres, as CARLA's GNSS sensor projects them: a Mercator projection scaled to the reference
latitude (``cos(lat_ref)``, the equatorial radius 6378137 m) around the town's OpenDRIVE georeference
(CARLA's and the leaderboard's 42.0 / 2.0 where the header names none: :class:`GeoReference`'s default),
inverted as the public CARLA agents do, in the ROS map frame of carla-ros-bridge (CARLA's with y flipped: x
east, y north), the frame of the bridge's odometry and the leaderboard's route. A route's own reference is
solved from one point known in both frames (:meth:`GeoReference.solve`, the global plan's first point).

    ref = GeoReference()                                     # CARLA's default georeference, 42.0 / 2.0
    x, y = ref.to_local(lat, lon)                            # NavSatFix -> metres in the map frame
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .measurements import MeasurementRefused

EARTH_RADIUS_EQUA_M = 6378137.0        # CARLA's (and WGS-84's) equatorial radius


def degrees_to_metres(deg: float, lat_ref_deg: float = 0.0) -> float:
    """Metres on the ground of ``deg`` degrees of latitude at the reference latitude (Mercator scale)."""
    return math.radians(deg) * EARTH_RADIUS_EQUA_M * math.cos(math.radians(lat_ref_deg))


@dataclass(frozen=True)
class GeoReference:
    """The map's georeference: latitude / longitude of the map origin (degrees); the defaults are
    CARLA's (and the leaderboard's) when the town's OpenDRIVE header names none."""
    lat_deg: float = 42.0
    lon_deg: float = 2.0

    def __post_init__(self):
        if not (math.isfinite(self.lat_deg) and -85.0 < self.lat_deg < 85.0):
            raise ValueError(f"lat_deg: {self.lat_deg!r} is not a latitude in (-85, 85) degrees")
        if not (math.isfinite(self.lon_deg) and -180.0 <= self.lon_deg <= 180.0):
            raise ValueError(f"lon_deg: {self.lon_deg!r} is not a longitude in [-180, 180] degrees")

    @property
    def _scale_m(self) -> float:
        return math.cos(math.radians(self.lat_deg)) * EARTH_RADIUS_EQUA_M

    def _mercator(self, lat_deg: float, lon_deg: float) -> tuple[float, float]:
        return (math.radians(lon_deg) * self._scale_m,
                math.log(math.tan(math.radians(90.0 + lat_deg) / 2.0)) * self._scale_m)

    def to_local(self, lat_deg: float, lon_deg: float) -> tuple[float, float]:
        """(x east, y north) metres in the ROS map frame (CARLA's x, -y). MeasurementRefused (``position``) for a
        latitude outside (-90, 90) (no value at the poles), a longitude outside [-360, 360] (it does not wrap: east
        of a reference near 180 reads above 180), or one not finite."""
        if not -90.0 < float(lat_deg) < 90.0:
            raise MeasurementRefused("position", f"latitude {lat_deg!r} is not in (-90, 90) degrees")
        if not -360.0 <= float(lon_deg) <= 360.0:
            raise MeasurementRefused("position", f"longitude {lon_deg!r} is not in [-360, 360] degrees")
        mx, my = self._mercator(lat_deg, lon_deg)
        mx0, my0 = self._mercator(self.lat_deg, self.lon_deg)
        return mx - mx0, my - my0

    @classmethod
    def solve(cls, lat_deg: float, lon_deg: float, x: float, y: float) -> "GeoReference":
        """The reference under which the map-frame point (``x`` east, ``y`` north, metres) reads ``lat_deg`` /
        ``lon_deg``: :meth:`to_local` inverted for one point known in both frames. The Mercator scale depends on
        the latitude solved for, so this iterates to its fixed point (a few steps reach float precision).
        ValueError naming the bad input (non-finite, or no latitude in range)."""
        for name, value in (("lat_deg", lat_deg), ("lon_deg", lon_deg), ("x", x), ("y", y)):
            if not math.isfinite(value):
                raise ValueError(f"{name}: {value!r} is not a finite number")
        if not -85.0 < lat_deg < 85.0:
            raise ValueError(f"lat_deg: {lat_deg!r} is not a latitude in (-85, 85) degrees")
        lat_ref = lat_deg
        for _ in range(50):
            scale = math.cos(math.radians(lat_ref)) * EARTH_RADIUS_EQUA_M
            my = math.log(math.tan(math.radians(90.0 + lat_deg) / 2.0)) * scale - y
            new = 2.0 * math.degrees(math.atan(math.exp(my / scale))) - 90.0
            if not -85.0 < new < 85.0:
                raise ValueError(f"y: {y!r} m north of the point puts the reference latitude at {new:.3f} degrees, "
                                 "outside (-85, 85): the point's map coordinates do not fit its GNSS reading")
            done, lat_ref = abs(new - lat_ref) < 1e-13, new
            if done:
                break
        lon_ref = lon_deg - math.degrees(x / (math.cos(math.radians(lat_ref)) * EARTH_RADIUS_EQUA_M))
        lon_ref = (lon_ref + 180.0) % 360.0 - 180.0
        return cls(lat_ref, lon_ref)

    def to_geo(self, x: float, y: float) -> tuple[float, float]:
        """(latitude, longitude) degrees of a map-frame point: what CARLA's GNSS reports there."""
        mx0, my0 = self._mercator(self.lat_deg, self.lon_deg)
        mx, my = mx0 + x, my0 + y
        lon = math.degrees(mx / self._scale_m)
        lat = 2.0 * math.degrees(math.atan(math.exp(my / self._scale_m))) - 90.0
        return lat, lon
