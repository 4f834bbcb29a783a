"""``wam-diff2-ros``: the ROS package's tools (not nodes), for machines without ``ros2 bag`` or CARLA.

    wam-diff2-ros replay run.mcap --clock                   # then: wam-diff2-planner ... -p use_sim_time:=true
    wam-diff2-ros replay bag_dir/ --rate 0.5 --topics /front/image /front/camera_info   # only these topics
    wam-diff2-ros replay run.mcap --clock --ros-args -r __ns:=/replay     # ROS arguments go last
    wam-diff2-ros replay run.mcap --clock --wait-for-planner --record node_out    # + what the planner answers
    wam-diff2-ros closed-loop --model CKPT --routes 10 --out runs/closed_loop     # planner + controller over DDS
    wam-diff2-ros closed-loop --model CKPT --timing leaderboard --planner-process subprocess --out runs/cl_lb
    wam-diff2-ros closed-loop --model CKPT --routes 3 --odometry estimated --out runs/cl_est

``replay`` (:mod:`.bag_player`) publishes a bag's messages over DDS with their recorded timing and
optional /clock, like ``ros2 bag play``; ``--record OUT_BAG`` records what comes back (default: the
planner's trajectory, detections and status) into a new bag, which ``wam-diff2 eval-bag BAG
--predictions OUT_BAG`` scores. ``closed-loop`` (:mod:`.dds_closed_loop`) drives the routes of
``wam-diff2 closed-loop`` (the same options and summary) with the demo world behind
carla-ros-bridge topics, the planner node (in this process or ``--planner-process subprocess``) in
lockstep mode every ``--lockstep-n`` ticks and the controller node every tick, with the
leaderboard's handshake and 1.0 s control deadline.

This module is ROS-free: ``--help`` and ``--version`` work anywhere; before a tool runs, the ROS 2
libraries are checked as the nodes' entry points check them (one line saying what to source).
"""
from __future__ import annotations

import argparse
import logging
import sys

REPLAY_HELP = "publish a bag's messages over DDS with their recorded timing (and /clock), like ros2 bag play"
CLOSED_LOOP_HELP = ("drive demo-world routes with the planner and controller nodes over DDS and report a "
                    "driving score")
PROG = "wam-diff2-ros"
RECORD_STORAGE, RECORD_GRACE_S = "mcap", 2.0     # replay --record's (None on the command line unless given)
# closed-loop's, also RosLoopSettings' (closed_loop_nodes.py, which needs rclpy); the first choice is the default
TIMINGS, ODOMETRY_SOURCES = ("lockstep", "leaderboard"), ("true", "estimated")


def add_replay_arguments(p) -> None:
    from wam_diff2_core.topics import PLANNER_NODE
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
    p.add_argument("--planner-node", default=f"/{PLANNER_NODE}", metavar="NODE",
                   help="the planner's full node name, for --wait-for-planner and the default --record-topics "
                        "(default %(default)s)")
    p.add_argument("--start-offset", dest="start_offset_s", type=float, default=0.0, metavar="S",
                   help="skip the bag's first S seconds")
    p.add_argument("--playback-duration", dest="playback_duration_s", type=float, default=None, metavar="S",
                   help="stop after S seconds of bag time")
    r = p.add_argument_group("recording what comes back (e.g. the planner's answers)")
    r.add_argument("--record", metavar="OUT_BAG", default=None,
                   help="while playing, record --record-topics into this new rosbag2 bag (written atomically)")
    r.add_argument("--record-topics", nargs="+", default=None, metavar="TOPIC",
                   help="topics to record (default: the planner's NODE/output/trajectory, NODE/output/detections "
                        "and NODE/status, NODE = --planner-node); playback waits (up to --wait-timeout-s) until each "
                        "has a publisher")
    r.add_argument("--record-storage", default=None, choices=("mcap", "sqlite3"), help=f"default {RECORD_STORAGE}")
    r.add_argument("--record-grace-s", type=float, default=None, metavar="S",
                   help=f"keep recording S seconds (wall) after the last played message (default {RECORD_GRACE_S})")
    r.add_argument("--overwrite", action="store_true", help="replace an existing --record bag")
    p.add_argument("--ros-args", dest="ros_args", nargs="...", default=None,
                   help="ROS arguments for the player node (remaps, log level), last on the line")


def add_closed_loop_arguments(p) -> None:
    from wam_diff2_core.cli.closed_loop import add_route_arguments
    from wam_diff2_core.params.controller import DEFAULTS as CONTROLLER_DEFAULTS, PACINGS
    from wam_diff2_core.params.leaderboard import ROLE_NAME
    add_route_arguments(p)
    p.add_argument("--timing", choices=TIMINGS, default=TIMINGS[0],
                   help="lockstep waits for each planning tick's trajectory; leaderboard waits only for the "
                        "control (1.0 s) and ticks at most at real time")
    p.add_argument("--planner-process", choices=("inprocess", "subprocess"), default="inprocess",
                   help="the planner node in this process or in its own")
    p.add_argument("--odometry", choices=ODOMETRY_SOURCES, default=ODOMETRY_SOURCES[0],
                   help="true: the simulator publishes its odometry; estimated: it publishes GNSS, IMU and a "
                        "speedometer with noise (as the leaderboard's SENSORS track) and the localization node's "
                        "estimate drives the planner and the controller")
    p.add_argument("--bridge", action="store_true",
                   help="play the Leaderboard 2.0 bridge and agent exactly (SENSORS track, CarlaSpeedometer, "
                        "CarlaRoute, CarlaEgoVehicleControl) and start the nodes with launch/leaderboard.launch.py's "
                        "parameters; implies --odometry estimated --command-source route")
    p.add_argument("--pacing", choices=PACINGS, default=CONTROLLER_DEFAULTS["pacing"],
                   help="the controller's pacing: hold the tick after a planning frame for its plan (at most "
                        "pacing_max_hold_wall_s) or answer at once with the newest plan (docs/carla.md)")
    p.add_argument("--planner-slowdown", type=float, default=1.0,
                   help="in-process planner: each plan takes this many times as long (it sleeps the difference); "
                        "to measure how pacing keeps scores independent of the planner's speed")
    p.add_argument("--role", default=ROLE_NAME, help="CARLA role name of the topics (default %(default)s)")
    p.add_argument("--domain-id", type=int, default=None, help="ROS domain (default: ROS_DOMAIN_ID or 0)")


# subcommand -> (help, its options, the module whose run(args) does it)
TOOLS = {"replay": (REPLAY_HELP, add_replay_arguments, "wam_diff2_ros.tools.bag_player"),
         "closed-loop": (CLOSED_LOOP_HELP, add_closed_loop_arguments, "wam_diff2_ros.tools.dds_closed_loop")}


def build_parser() -> argparse.ArgumentParser:
    from wam_diff2_core.version import __version__
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_, add_options, _) in TOOLS.items():
        add_options(sub.add_parser(name, help=help_, description=help_))
    return parser


def main(argv: list[str] | None = None) -> int:
    from wam_diff2_core.cli import offline_environment, run_reporting_errors

    from ..entry_point import import_node_module

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    offline_environment()
    tool = import_node_module(f"{PROG} {args.command}", TOOLS[args.command][2])
    if isinstance(tool, int):
        return tool                       # the ROS 2 libraries or a Python library cannot load: said in one line
    return run_reporting_errors(f"{PROG} {args.command}", tool.run, args)


if __name__ == "__main__":
    sys.exit(main())
