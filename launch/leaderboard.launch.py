"""The WAM-Diff2 agent for the CARLA leaderboard / Bench2Drive ROS agent setup: localization + planner + controller.

    ros2 launch wam_diff2_ros leaderboard.launch.py model_path:=/path/to/checkpoint
    ros2 launch wam_diff2_ros leaderboard.launch.py model_path:=... role_name:=ego_vehicle lockstep_n:=5
    ros2 launch wam_diff2_ros leaderboard.launch.py model_path:=... localization:=false   # the bridge's odometry

Topics are carla-ros-bridge's of ``role_name`` (wam_diff2_core/topics.py), named here by their keys there.
The leaderboard's SENSORS track gives GNSS, IMU and a speedometer, no odometry: with
``localization`` true (the default) the localization node turns the <gnss_id>, <imu_id> and
<speedometer_id> topics into odometry (``lat_ref_deg`` /
``lon_ref_deg``: the town's georeference, CARLA's 42.0 / 2.0 by default; the agent sets each
route's own on the node once the route is known). agents/wam_diff2_agent.py starts this file.

The planner (a lifecycle node) plans in lockstep on every ``lockstep_n``-th camera tick of
the <camera_id> image, on simulation time; the controller answers every tick
(each odometry message, or each /clock message with tick_source:=clock)
with carla_msgs/CarlaEgoVehicleControl on vehicle_control_cmd, stamped
with the tick's sim time, and publishes the latched std_msgs/Bool True on
the role's status topic once the planner is READY (model loaded, warmed up), which is when
the leaderboard starts ticking (never without carla_msgs: then the controller reports ERROR on
/diagnostics instead). The controller tracks the route (global_plan
CarlaRoute with RoadOptions, or waypoints) and sends its command to the
planner. ``fixed_delta_seconds`` is the simulator's tick (the leaderboard's 0.05 s): a plan
arriving more than lockstep_n ticks after its image counts as late in /diagnostics.

The arguments, nodes and parameters are those of ``wam_diff2_core.params.leaderboard`` (the demo
world's ``wam-diff2-ros closed-loop --bridge`` starts the same nodes from it). See docs/carla.md.
"""
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import LifecycleNode, Node
from launch_ros.parameter_descriptions import ParameterValue

from wam_diff2_core.params.leaderboard import ARGUMENTS, NODES, PACKAGE, Arg, Product, default_value


def _substitution(value):
    """A parameter value of NODES as the launch system's: an argument typed by ParameterValue."""
    if isinstance(value, Arg):
        return ParameterValue(LaunchConfiguration(value.name), value_type=value.type)
    if isinstance(value, Product):
        a, b = (LaunchConfiguration(f.name) for f in value.factors)
        return ParameterValue(PythonExpression([a, " * ", b]), value_type=float)
    return value


def generate_launch_description():
    share = get_package_share_directory(PACKAGE)
    actions = []
    for argument in ARGUMENTS:
        default = default_value(argument, share)
        actions.append(DeclareLaunchArgument(argument.name, description=argument.description,
                                             **({} if default is None else {"default_value": default})))
    for spec in NODES:
        kind = LifecycleNode if spec.lifecycle else Node
        params_file = [LaunchConfiguration(spec.params_file.name)] if spec.params_file else []
        actions.append(kind(
            package=PACKAGE,
            executable=spec.executable,
            name=spec.name,
            namespace="",
            output="screen",
            condition=IfCondition(LaunchConfiguration(spec.condition.name)) if spec.condition else None,
            parameters=params_file + [{k: _substitution(v) for k, v in spec.parameters.items()}],
            remappings=[(source, [LaunchConfiguration(p.name) if isinstance(p, Arg) else p for p in target])
                        for source, target in spec.remappings],
        ))
    return LaunchDescription(actions)
