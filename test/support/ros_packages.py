"""ROS message packages the tests import by name (carla_msgs, derived_object_msgs, tf2_msgs), with an error that
says how to get them when they are missing."""
from __future__ import annotations

import importlib


def interface_module(package: str):
    """``<package>.msg`` of an upstream interface package (carla_msgs, derived_object_msgs), the real one
    that scripts/build_ros_interfaces.sh builds; an ImportError saying how to get it when it is absent."""
    try:
        return importlib.import_module(f"{package}.msg")
    except ImportError as exc:
        raise ImportError(f"{package} is not importable ({exc}): build it with `bash scripts/build_ros_interfaces.sh` "
                          f"(run by scripts/setup.sh) and source scripts/env.sh") from exc
