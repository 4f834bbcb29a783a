"""The message types a bag is read and written with, as rosbags types: ROS 2 Kilted's standard set,
carla-ros-bridge's ``derived_object_msgs`` when installed and this package's ``msg/*.msg``; and
the definitions a bag stores per connection.

    store = default_typestore()                    # for writing bags
    store.serialize_cdr(msg, "nav_msgs/msg/Odometry")
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from ..topics import PACKAGE
from .derived_objects import installed_msg_dirs, object_types


@lru_cache(maxsize=1)
def default_types() -> dict[str, Any]:
    """Kilted's standard message types, carla-ros-bridge's ``derived_object_msgs`` when installed (see
    :mod:`.derived_objects`) and this package's, as a rosbags types dict."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    types = dict(get_typestore(Stores.ROS2_KILTED).fielddefs)
    try:
        types.update(object_types())
    except LookupError:       # only writing needs them: a recorded bag carries its own definitions
        pass
    # this package's msg/ folder: the source tree's, else an installed share/<pkg>/msg
    candidates = [Path(__file__).resolve().parents[2] / "msg", *installed_msg_dirs(PACKAGE)]
    msg_dir = next((c for c in candidates if c.is_dir() and any(c.glob("*.msg"))), None)
    if msg_dir is not None:
        for path in sorted(msg_dir.glob("*.msg")):
            types.update(get_types_from_msg(path.read_text(), f"{PACKAGE}/msg/{path.stem}"))
    return types


def default_typestore():
    """A typestore with :func:`default_types` (for writing bags)."""
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.EMPTY)
    store.register(default_types())
    return store


def types_from_connection(conn) -> dict[str, Any]:
    """The message types a bag connection's stored definition (.msg or .idl) declares; {} when it has none."""
    from rosbags.interfaces import MessageDefinitionFormat
    from rosbags.typesys import get_types_from_idl, get_types_from_msg

    fmt, data = conn.msgdef.format, conn.msgdef.data
    if fmt == MessageDefinitionFormat.MSG and data:
        return get_types_from_msg(data, conn.msgtype)
    if fmt == MessageDefinitionFormat.IDL and data:
        sep = "=" * 80 + "\n"
        types: dict[str, Any] = {}
        for part in (data.split(sep)[1:] if data.startswith(f"{sep}IDL: ") else [data]):
            types.update(get_types_from_idl(part.split("\n", 1)[1] if part.startswith("IDL: ") else part))
        return types
    return {}
