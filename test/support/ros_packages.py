"""The ROS packages of this machine's ament index (AMENT_PREFIX_PATH), for the tests that check imports."""
from __future__ import annotations

import os
from pathlib import Path


def ament_index_packages() -> set[str]:
    names = set()
    for prefix in filter(None, os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep)):
        index = Path(prefix) / "share" / "ament_index" / "resource_index" / "packages"
        if index.is_dir():
            names.update(p.name for p in index.iterdir())
    return names


def interface_module(package: str):
    """``<package>.msg`` of an upstream interface package (carla_msgs, derived_object_msgs), the real one
    that scripts/build_ros_interfaces.sh builds; an ImportError saying how to get it when it is absent."""
    import importlib

    try:
        return importlib.import_module(f"{package}.msg")
    except ImportError as exc:
        raise ImportError(f"{package} is not importable ({exc}): build it with `bash scripts/build_ros_interfaces.sh` "
                          f"(run by scripts/setup.sh) and source scripts/env.sh") from exc
