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
