"""Odometry from GNSS + IMU + speedometer: the leaderboard's SENSORS track gives no odometry. ROS-free.

- :mod:`.measurements`    the sensors' noise and the checks that refuse a hostile measurement;
- :mod:`.georeference`    GNSS latitude / longitude <-> metres in the map frame (CARLA's projection);
- :mod:`.odometry_filter` the EKF over x, y, heading and speed behind the localization node.

    from wam_diff2_core.localization.georeference import GeoReference
    from wam_diff2_core.localization.odometry_filter import LocalizationSettings, OdometryFilter
"""
