"""Play a rosbag2 bag over DDS with its recorded timing and optional /clock (no ``ros2 bag`` needed).

    wam-diff2 replay run.mcap --clock                      # then: wam-diff2-planner ... -p use_sim_time:=true
    wam-diff2 replay bag_dir/ --rate 0.5 --topics /carla/ego_vehicle/rgb_front/image /carla/ego_vehicle/odometry
    wam-diff2 replay run.mcap --clock --ros-args -r __ns:=/replay     # ROS arguments go last
    wam-diff2 replay run.mcap --clock --wait-for-planner --record node_out    # + what the planner answers

``--record OUT_BAG`` subscribes to ``--record-topics`` (default: the planner's trajectory,
detections and status under /wam_diff2_planner) and writes every message received, as received,
into a new bag (logged at the playback time of arrival, i.e. the bag's time base; kept going
``--record-grace-s`` after the last played message; written atomically). Score it with
``wam-diff2 eval-bag BAG --predictions OUT_BAG``.

On a ROS 2 installation ``ros2 bag play --clock BAG`` does the same. Needs rclpy (the set-up's
ROS 2 wheels); the player lives in ``wam_diff2_ros.replay``.
"""
from __future__ import annotations

import sys

HELP = "publish a bag's messages over DDS with their recorded timing (and /clock), like ros2 bag play"


def add_arguments(p, ros_args: bool = True) -> None:
    """The player's options (also used by ``python -m wam_diff2_ros.replay``)."""
    p.add_argument("bag", help="rosbag2 folder, .mcap or .db3 file")
    p.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1.0)")
    p.add_argument("--clock", action="store_true", help="publish /clock from the bag's time (for use_sim_time)")
    p.add_argument("--clock-hz", type=float, default=100.0, help="/clock publishing rate (default 100)")
    p.add_argument("--topics", nargs="+", default=(), metavar="TOPIC", help="play only these topics")
    p.add_argument("--latched", nargs="+", default=(), metavar="TOPIC",
                   help="also offer these topics transient local (latched)")
    p.add_argument("--delay-s", type=float, default=1.0,
                   help="wait this long after creating the publishers before the first message (default 1.0)")
    p.add_argument("--wait-for-subscribers", nargs="+", default=(), metavar="TOPIC",
                   help="start once each of these topics (or /clock) has a subscriber, then wait --delay-s")
    p.add_argument("--wait-timeout-s", type=float, default=60.0,
                   help="give up (exit 2) when --wait-for-subscribers is not met in time (default 60)")
    p.add_argument("--wait-for-planner", action="store_true",
                   help="also wait until the planner's latched PLANNER_NODE/status says READY (model loaded); an "
                        "ERROR status stops with exit 2")
    p.add_argument("--planner-node", default="/wam_diff2_planner", metavar="NODE",
                   help="the planner's full node name, for --wait-for-planner and the default --record-topics "
                        "(default /wam_diff2_planner)")
    p.add_argument("--start-offset", type=float, default=0.0, metavar="S", help="skip the bag's first S seconds")
    p.add_argument("--playback-duration", type=float, default=None, metavar="S",
                   help="stop after S seconds of bag time")
    r = p.add_argument_group("recording what comes back (e.g. the planner's answers)")
    r.add_argument("--record", metavar="OUT_BAG", default=None,
                   help="while playing, record --record-topics into this new rosbag2 bag (written atomically)")
    r.add_argument("--record-topics", nargs="+", default=None, metavar="TOPIC",
                   help="topics to record (default: the planner's NODE/output/trajectory, NODE/output/detections "
                        "and NODE/status, NODE = --planner-node); playback waits (up to --wait-timeout-s) until each "
                        "has a publisher")
    r.add_argument("--record-storage", default=None, choices=("mcap", "sqlite3"), help="default mcap")
    r.add_argument("--record-grace-s", type=float, default=None, metavar="S",
                   help="keep recording S seconds (wall) after the last played message (default 2.0)")
    r.add_argument("--overwrite", action="store_true", help="replace an existing --record bag")
    if ros_args:
        p.add_argument("--ros-args", dest="ros_args", nargs="...", default=None,
                       help="ROS arguments for the player node (remaps, log level), last on the line")


def run(args) -> int:
    try:
        from wam_diff2_ros.replay import run as play
    except ImportError as exc:
        print(f"wam-diff2 replay: error: needs rclpy and the ROS 2 message packages ({exc}); "
              "run `make setup` or source a ROS 2 installation", file=sys.stderr)
        return 2
    ros_args = ["--ros-args", *args.ros_args] if args.ros_args is not None else None
    return play(args, ros_args)
