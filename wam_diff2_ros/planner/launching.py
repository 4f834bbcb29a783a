"""The planner as the launch files start it: its shared launch arguments and its LifecycleNode, once
(``launch`` / ``launch_ros`` are imported only inside the functions that build launch actions).

The node's parameters are ``params_file`` first, then :func:`planner_parameters` (so ``device`` and
``image_reliability`` given at launch override the file). :func:`planner_parameters`, :func:`two_planners`
and :func:`bridge_remappings` are plain data given a function from argument name to value, so a test
starts nodes with exactly what a launch file gives them.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

from wam_diff2_core.params import planner as params
from wam_diff2_core.topics import PACKAGE, PLANNER_NODE, carla_topic_parts

EXECUTABLE = "wam-diff2-planner"
# launch arguments that set the planner parameter of the same name
PARAMETER_ARGUMENTS = ("model_path", "device", "image_reliability")
ARGUMENT_DESCRIPTIONS = {
    "namespace": "namespace of the planner (its topics: /<namespace>/wam_diff2_planner/...); empty: none",
    "model_path": "checkpoint directory (Qwen3-VL or WAM-Diff2) or hub id",
    "params_file": "planner parameters (default: the package's config/planner.yaml)",
    "device": params.SPECS_BY_NAME["device"].description,
    "image_reliability": params.SPECS_BY_NAME["image_reliability"].description,
}
# launch/two_planners.launch.py, an A/B test on one camera: namespace -> the installed demo model it runs
TWO_PLANNERS = {"block32": "wam-diff2-demo-b32", "ar": "wam-diff2-demo-ar"}


def demo_model(share: str, name: str = TWO_PLANNERS["block32"]) -> str:
    """An installed demo model (``share``: the package's share folder)."""
    return os.path.join(share, "models", name)


def argument_defaults(share: str, model_path: str | None = None,
                      image_reliability: str = params.DEFAULTS["image_reliability"]) -> dict[str, str | None]:
    """{argument: default} of the shared launch arguments; None: required. ``image_reliability``: a
    launch file's own default, for publishers known to be reliable (carla-ros-bridge)."""
    if image_reliability not in params.IMAGE_RELIABILITIES:
        raise ValueError(f"image_reliability: {image_reliability!r} is not one of {params.IMAGE_RELIABILITIES}")
    return {"namespace": "", "model_path": model_path,
            "params_file": os.path.join(share, "config", "planner.yaml"),
            "device": params.DEFAULTS["device"], "image_reliability": image_reliability}


def planner_parameters(argument: Callable[[str], Any], fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The parameters a launch file sets on the planner after ``params_file``: those of
    PARAMETER_ARGUMENTS from ``argument(name)``, then ``fixed``."""
    return {**{name: argument(name) for name in PARAMETER_ARGUMENTS}, **(fixed or {})}


def two_planners(argument: Callable[[str], Any]) -> list[tuple[str, dict[str, Any], list[tuple[str, Any]]]]:
    """launch/two_planners.launch.py's planners as (namespace, parameters, remappings): each reads
    its own ``<namespace>_model_path`` argument, both the shared ``image_topic`` and ``odometry_topic``."""
    remappings = [("~/input/image", argument("image_topic")), ("~/input/odometry", argument("odometry_topic"))]
    return [(namespace, planner_parameters(lambda name, ns=namespace: argument(
        f"{ns}_{name}" if name == "model_path" else name)), remappings) for namespace in TWO_PLANNERS]


def bridge_remappings(argument: Callable[[str], Any]) -> list[tuple[str, list]]:
    """The planner's image, camera_info, odometry and route remapped onto carla-ros-bridge's topics of the
    ``role_name`` and ``camera_id`` arguments (each target a list of literal pieces and argument values, as launch
    substitutions take it)."""
    role, camera = argument("role_name"), argument("camera_id")
    return [(f"~/input/{name}", list(carla_topic_parts(name, role, camera)))
            for name in ("image", "camera_info", "odometry", "route")]


def launch_argument(name: str):
    from launch.substitutions import LaunchConfiguration
    return LaunchConfiguration(name)


def declare_planner_arguments(share: str, names: Sequence[str] = tuple(ARGUMENT_DESCRIPTIONS),
                              **defaults: Any) -> list:
    """``DeclareLaunchArgument`` of each of ``names`` with :func:`argument_defaults` (``defaults``:
    its keywords)."""
    from launch.actions import DeclareLaunchArgument
    values = argument_defaults(share, **defaults)
    return [DeclareLaunchArgument(name, default_value=values[name], description=ARGUMENT_DESCRIPTIONS[name])
            for name in names]


def planner_node(parameters: Mapping[str, Any], remappings: Sequence[tuple[str, Any]] = (), namespace: Any = None):
    """The planner's ``LifecycleNode``: ``params_file``, then ``parameters`` (launch substitutions
    typed as the parameter table types them), inputs remapped by ``remappings`` (``~/input/...`` ->
    topic), in ``namespace`` (default: the ``namespace`` argument)."""
    from launch_ros.actions import LifecycleNode
    from launch_ros.parameter_descriptions import ParameterValue
    typed = {key: value if isinstance(value, (str, bool, int, float))
             else ParameterValue(value, value_type=bool if key == "use_sim_time" else params.SPECS_BY_NAME[key].kind)
             for key, value in parameters.items()}
    return LifecycleNode(
        package=PACKAGE,
        executable=EXECUTABLE,
        name=PLANNER_NODE,
        namespace=launch_argument("namespace") if namespace is None else namespace,
        output="screen",
        parameters=[launch_argument("params_file"), typed],
        remappings=list(remappings),
    )
