"""The planner node at camera rate over real DDS: camera -> trajectory latency, frames planned and dropped,
memory and the time from configure to active.

    . scripts/env.sh && python scripts/node_rate.py --random tiny --device cpu --size 160 90 --rate-hz 5 \\
        --duration-s 10 --out /tmp/rate_tiny.jsonl                      # this CPU: the tiny random checkpoint
    python scripts/node_rate.py --random 2b --device cuda --out rate_2b.jsonl                  # a GPU: 1080p, 10 Hz, 60 s
    python scripts/node_rate.py --model models/wam-diff2-demo-b32 --device cuda --out rate_demo.jsonl

The planner runs as its own process (``python -m wam_diff2_ros.planner.node``, the parameters of
config/planner.yaml with autostart off, realtime mode, ``image_reliability: reliable``, no debug image or
markers); this process is the car: on each camera tick it publishes the odometry of the demo world's ego
and then a ``bgra8`` frame of the demo world's front camera scaled to ``--size``, both with the tick's stamp
(the system clock now, as carla-ros-bridge stamps a tick's sensors alike), over carla-ros-bridge's reliable
keep-last-10 QoS; the route once, latched. Both processes use config/fastdds_large_frames.xml (a 32 MiB
shared-memory segment: raw 1080p frames are 8.3 MB). It configures and activates the node over its
lifecycle services (timed: configure includes the load, the fast-path check, the warm-up and the CUDA graph
capture), publishes for ``--duration-s``, waits until every frame the node received is accounted for, and
reads the node's counters from ``/diagnostics``.

Rows, JSON lines appended to ``--out`` as they are measured (a run stopped at its bound leaves what it had):
``{"row": "start"}`` (process up, configure, activate, the node's own configure_s / load_s / warmup_s),
one ``{"row": "frame"}`` per trajectory received (its stamp, camera -> trajectory latency from that stamp to
its arrival here, the node's policy ms, tokens, validity), then ``{"row": "summary"}``: latency p50 / p95,
frames published / received by the node / planned / dropped by keep-latest / skipped / lost on the wire,
peak memory (torch's peak allocated on CUDA, RSS on CPU) and, with nvidia-smi, the planner process's GPU
memory. ``--random 2b`` writes a random-weight checkpoint of Qwen3-VL-2B's shape and vision tower (the device
check's frame model, ``benchmark.device_timing.frame_policy``) into a temporary folder first; its answers do
not parse (every trajectory is invalid, ``parse_retry: none``), which times the decode and not the parsing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PARAMS_FILE = REPO / "config" / "planner.yaml"
LARGE_FRAMES_PROFILE = REPO / "config" / "fastdds_large_frames.xml"
RANDOM_SHAPES = ("tiny", "small", "2b")
RANDOM_NEW_TOKENS = 96           # a random model's answer: three Block-32 blocks, about a plan's length
SETTLE_TIMEOUT_S = 60.0          # after the last frame: wall time for the node to account for every frame


class Rows:
    """JSON lines appended (and flushed) to ``path`` as each row is measured."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def add(self, row: dict) -> dict:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return row


def write_random_checkpoint(out: Path, shape: str, device: str, seed: int) -> Path:
    """A random-weight checkpoint in ``out``: ``tiny``, the tests' tiny model (``model.tiny``); ``small`` / ``2b``,
    the device check's frame model (Qwen's token layout; ``2b``: Qwen3-VL-2B's text model and vision tower)."""
    if shape == "tiny":
        from wam_diff2_core.model.tiny import build_tiny_checkpoint
        return build_tiny_checkpoint(out, seed=seed)
    import torch

    from wam_diff2_core.benchmark.device_timing import DeviceCheck, frame_policy
    from wam_diff2_core.config import write_diffusion_file
    from wam_diff2_core.model.saving import save_checkpoint

    on_cpu = device == "cpu"
    loaded = frame_policy(torch.device(device), torch.float32 if on_cpu else torch.bfloat16,
                          DeviceCheck(shape=shape, seed=seed, new_tokens=RANDOM_NEW_TOKENS)).loaded
    save_checkpoint(loaded.model, loaded.processor, out)
    config = loaded.config
    write_diffusion_file(out, block_size=config.block_size, mask_token_id=config.mask_token_id,
                         eos_token_id=config.eos_token_id, decoding=config.settings)
    del loaded
    if not on_cpu:
        torch.cuda.empty_cache()
    return out


def planner_process(model: str, device: str, threads: int, random: bool, params: list[str], log) -> subprocess.Popen:
    """``wam_diff2_ros.planner.node`` as its own process: config/planner.yaml, then this run's settings."""
    settings = {"model_path": model, "device": device, "autostart": "false", "mode": "realtime",
                "image_reliability": "reliable", "debug.publish_image": "false", "debug.publish_markers": "false",
                "diagnostics_period_s": "0.5", "engine.cpu_threads": str(threads)}
    if random:          # its answers never parse: no second decode per frame, a plan's length of tokens
        settings.update({"parse_retry": "none", "decoding.max_new_tokens": str(RANDOM_NEW_TOKENS)})
    cmd = [sys.executable, "-m", "wam_diff2_ros.planner.node", "--ros-args", "--params-file", str(PARAMS_FILE)]
    for name, value in settings.items():
        cmd += ["-p", f"{name}:={value}"]
    for p in params:
        cmd += ["-p", p]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))


def camera_frame(width: int, height: int):
    """(the demo world's first route, its front camera's frame as ``bgra8`` scaled to width x height)."""
    import cv2

    from wam_diff2_core.sim.route_runs import ClosedLoopSettings, RouteRun

    run = RouteRun(0, ClosedLoopSettings())
    bgra = cv2.cvtColor(cv2.resize(run.render(), (width, height), interpolation=cv2.INTER_LINEAR),
                        cv2.COLOR_RGB2BGRA)                                                  # [H, W, 4]
    return run, bgra


def gpu_memory_mb(pid: int) -> float | None:
    """The GPU memory nvidia-smi gives process ``pid`` (its whole CUDA context); None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    used = [float(mb) for p, mb in (line.split(",") for line in out.strip().splitlines() if "," in line)
            if int(p) == pid]
    return sum(used) if used else None


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


class Car:
    """This process's DDS side: camera, odometry and route out; trajectories, status and the planner's
    ``/diagnostics`` in; the planner's lifecycle services."""

    def __init__(self, context, planner: str):
        from diagnostic_msgs.msg import DiagnosticArray
        from lifecycle_msgs.srv import ChangeState
        from nav_msgs.msg import Odometry, Path
        from rclpy.node import Node
        from sensor_msgs.msg import Image

        from wam_diff2_ros.msg import PlannerStatus, Trajectory
        from wam_diff2_ros.qos import BRIDGE_QOS, DEEP_RELIABLE_QOS, LATCHED_QOS, RECEIVE_QOS

        self.node = Node("node_rate_car", context=context)
        self.image_pub = self.node.create_publisher(Image, f"/{planner}/input/image", BRIDGE_QOS)
        self.odometry_pub = self.node.create_publisher(Odometry, f"/{planner}/input/odometry", BRIDGE_QOS)
        self.route_pub = self.node.create_publisher(Path, f"/{planner}/input/route", LATCHED_QOS)
        self._lock = threading.Lock()
        self.arrivals: list[tuple[int, int, object]] = []          # (arrival ns, image stamp ns, Trajectory)
        self.diagnostics: dict[str, str] = {}
        self.status = None
        self.trajectory_sub = self.node.create_subscription(Trajectory, f"/{planner}/output/trajectory",
                                                            self._on_trajectory, DEEP_RELIABLE_QOS)
        self.node.create_subscription(PlannerStatus, f"/{planner}/status", self._on_status, LATCHED_QOS)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, RECEIVE_QOS)
        self.change_state = self.node.create_client(ChangeState, f"/{planner}/change_state")
        self._planner = planner

    def _on_trajectory(self, msg) -> None:
        now = time.time_ns()
        with self._lock:
            self.arrivals.append((now, msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec, msg))

    def _on_status(self, msg) -> None:
        self.status = msg

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name.startswith(f"{self._planner}: "):
                with self._lock:
                    self.diagnostics = {kv.key: kv.value for kv in status.values}

    def take_arrivals(self) -> list:
        with self._lock:
            out, self.arrivals = self.arrivals, []
        return out

    def counts(self) -> dict[str, str]:
        with self._lock:
            return dict(self.diagnostics)

    def transition(self, transition_id: int, timeout_s: float) -> float:
        """Ask the planner for a lifecycle transition; the wall seconds until it answered success."""
        from lifecycle_msgs.srv import ChangeState

        t0 = time.perf_counter()
        future = self.change_state.call_async(ChangeState.Request(transition=_transition(transition_id)))
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout_s):
            raise TimeoutError(f"lifecycle transition {transition_id}: no answer within {timeout_s} s")
        if not future.result().success:
            status = self.status.message if self.status is not None else "no status"
            raise RuntimeError(f"lifecycle transition {transition_id} failed: {status}")
        return time.perf_counter() - t0


def _transition(transition_id: int):
    from lifecycle_msgs.msg import Transition
    return Transition(id=transition_id)


def run(args) -> int:
    os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(LARGE_FRAMES_PROFILE))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ["ROS_DOMAIN_ID"] = str(args.domain_id)
    import rclpy
    from lifecycle_msgs.msg import Transition
    from sensor_msgs.msg import Image
    from std_msgs.msg import Header

    from wam_diff2_core.topics import PLANNER_NODE
    from wam_diff2_ros.conversions import ns_to_stamp
    from wam_diff2_ros.spinning import SpinThread, wait_until
    from wam_diff2_ros.tools.simulator_bridge import odometry_message, route_poses

    rows = Rows(Path(args.out))
    label = args.label or (f"random {args.random}" if args.random else Path(args.model).name)
    width, height = args.size
    tmp = tempfile.TemporaryDirectory(prefix="node_rate_")
    model = args.model
    if args.random:
        t0 = time.perf_counter()
        model = str(write_random_checkpoint(Path(tmp.name) / f"random-{args.random}", args.random, args.device,
                                            args.seed))
        rows.add({"row": "checkpoint", "label": label, "shape": args.random, "write_s": time.perf_counter() - t0})
    log_path = Path(args.out).with_suffix(".planner.log")
    log = log_path.open("w")
    t_process = time.perf_counter()
    process = planner_process(model, args.device, args.threads, bool(args.random), args.param, log)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=args.domain_id)
    car = Car(context, PLANNER_NODE)
    spinner = SpinThread(car.node)
    try:
        if not car.change_state.wait_for_service(timeout_sec=args.startup_timeout_s):
            raise TimeoutError(f"the planner's lifecycle services did not come up within {args.startup_timeout_s} s "
                               f"(log: {log_path})")
        process_up_s = time.perf_counter() - t_process
        run_, frame = camera_frame(width, height)
        header = Header(frame_id="map")
        car.route_pub.publish(route_path(run_, header, route_poses))
        configure_s = car.transition(Transition.TRANSITION_CONFIGURE, args.startup_timeout_s)
        activate_s = car.transition(Transition.TRANSITION_ACTIVATE, 60.0)
        # every link matched at both ends before the first frame: a frame sent earlier would be lost
        matched = wait_until(lambda: car.image_pub.get_subscription_count() > 0
                             and car.odometry_pub.get_subscription_count() > 0
                             and car.trajectory_sub.get_publisher_count() > 0
                             and int(car.counts().get("image_publishers", 0)) > 0, 30.0, poll_s=0.05)
        if not matched:
            raise TimeoutError("the planner's image / odometry / trajectory topics did not match within 30 s")
        diagnostics = car.counts()
        rows.add({"row": "start", "label": label, "model": model if not args.random else f"random-{args.random}",
                  "device": args.device, "process_up_s": process_up_s, "configure_s": configure_s,
                  "activate_s": activate_s, "configure_to_active_s": configure_s + activate_s,
                  **{f"node_{k}": float(diagnostics[k]) for k in ("configure_s", "load_s", "fast_path_check_s",
                                                                   "warmup_s") if k in diagnostics},
                  "decoder": diagnostics.get("decoder", "?")})

        image = Image(height=height, width=width, encoding="bgra8", is_bigendian=0, step=4 * width,
                      data=frame.tobytes())
        image.header.frame_id = "rgb_front"
        published: set[int] = set()
        frames: list[dict] = []
        period_ns = int(1e9 / args.rate_hz)
        start = time.perf_counter()
        ticks = int(round(args.duration_s * args.rate_hz))

        def drain():
            for arrival_ns, stamp_ns, msg in car.take_arrivals():
                frames.append(rows.add({
                    "row": "frame", "stamp_ns": stamp_ns, "known_stamp": stamp_ns in published,
                    "latency_ms": (arrival_ns - stamp_ns) / 1e6, "policy_ms": float(msg.stats.latency_ms),
                    "tokens": int(msg.stats.tokens), "valid": bool(msg.valid),
                    "peak_memory_mb": float(msg.stats.stages.peak_memory_mb),
                    "memory_kind": msg.stats.stages.memory_kind}))

        for tick in range(ticks):
            wait = start + tick * period_ns / 1e9 - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            stamp_ns = time.time_ns()
            car.odometry_pub.publish(odometry_message(run_, stamp_ns, "hero"))     # the tick's odometry first
            image.header.stamp = ns_to_stamp(stamp_ns)
            published.add(stamp_ns)
            car.image_pub.publish(image)
            drain()
        publish_s = time.perf_counter() - start

        def settled() -> bool:
            """Every published frame received by the node and handled, every plan received here."""
            drain()
            c = car.counts()
            received, planned = int(c.get("images_received", 0)), int(c.get("images_processed", 0))
            handled = planned + int(c.get("images_dropped_newer_arrived", 0)) + skipped_count(c)
            return received >= len(published) and handled >= received and len(frames) >= planned
        # the node's counters come with /diagnostics every 0.5 s: wait until they account for every frame
        wait_until(settled, SETTLE_TIMEOUT_S, poll_s=0.1)
        time.sleep(1.0)                     # one more /diagnostics period, so the counters read are the final ones
        drain()
        counts = car.counts()
        gpu_mb = gpu_memory_mb(process.pid) if args.device.startswith("cuda") else None
        rows.add(summary_row(label, args, frames, len(published), publish_s, counts, gpu_mb))
    finally:
        spinner.stop()
        rclpy.shutdown(context=context)
        stop_process(process)
        log.close()
        tmp.cleanup()
    return 0


def route_path(run_, header, route_poses):
    from geometry_msgs.msg import PoseStamped
    from nav_msgs.msg import Path
    return Path(header=header, poses=[PoseStamped(header=header, pose=pose) for pose in route_poses(run_.route_xy())])


def skipped_count(counts: dict[str, str]) -> int:
    return sum(int(v) for k, v in counts.items() if k.startswith("skipped_") and v.lstrip("-").isdigit())


def summary_row(label: str, args, frames: list[dict], published: int, publish_s: float, counts: dict[str, str],
                gpu_mb: float | None) -> dict:
    """The run's figures: latency percentiles over the trajectories received, and where each published frame went
    (received by the node or lost on the wire; planned, dropped because a newer one arrived, or skipped)."""
    latency = [f["latency_ms"] for f in frames]
    policy = [f["policy_ms"] for f in frames]
    received = int(counts.get("images_received", 0))
    planned = int(counts.get("images_processed", 0))
    dropped = int(counts.get("images_dropped_newer_arrived", 0))
    skipped = skipped_count(counts)
    return {"row": "summary", "label": label, "device": args.device, "size": f"{args.size[0]}x{args.size[1]}",
            "rate_hz": args.rate_hz, "duration_s": args.duration_s, "publish_s": publish_s,
            "frames_published": published, "received_by_node": received, "lost_on_wire": published - received,
            "planned": planned, "dropped_keep_latest": dropped, "skipped": skipped,
            "skips": {k: int(v) for k, v in counts.items() if k.startswith("skipped_") and int(v)},
            "unaccounted": received - planned - dropped - skipped,
            "trajectories_received": len(frames), "unknown_stamps": sum(not f["known_stamp"] for f in frames),
            "valid_plans": sum(f["valid"] for f in frames), "planned_hz": planned / publish_s if publish_s else None,
            "latency_p50_ms": percentile(latency, 50), "latency_p95_ms": percentile(latency, 95),
            "latency_max_ms": max(latency, default=None), "policy_p50_ms": percentile(policy, 50),
            "tokens_p50": percentile([f["tokens"] for f in frames], 50),
            "peak_memory_mb": max((f["peak_memory_mb"] for f in frames), default=None),
            "memory_kind": frames[-1]["memory_kind"] if frames else None, "gpu_process_mb": gpu_mb,
            **{k: float(v) for k, v in counts.items() if k.startswith("stage_") and k.endswith("_ms")}}


def stop_process(process: subprocess.Popen) -> None:
    """Ctrl-C for the planner (it lets a decode in flight finish for at most 2 s), then kill."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="a checkpoint folder (e.g. models/wam-diff2-demo-b32)")
    model.add_argument("--random", choices=RANDOM_SHAPES, help="a random-weight checkpoint of this shape, written "
                       "into a temporary folder first")
    p.add_argument("--device", default="cuda", help="the planner's device parameter (default cuda)")
    p.add_argument("--size", type=int, nargs=2, default=(1920, 1080), metavar=("W", "H"),
                   help="camera frame size (default 1920 1080)")
    p.add_argument("--rate-hz", type=float, default=10.0, help="camera rate (default 10)")
    p.add_argument("--duration-s", type=float, default=60.0, help="how long the camera publishes (default 60)")
    p.add_argument("--threads", type=int, default=0, help="the planner's engine.cpu_threads (default 0: its own)")
    p.add_argument("--param", action="append", default=[], metavar="NAME:=VALUE",
                   help="another planner parameter (repeatable), after this run's own")
    p.add_argument("--startup-timeout-s", type=float, default=300.0,
                   help="wall time for the process to come up and for configure (default 300)")
    p.add_argument("--domain-id", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "0") or 0))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="", help="the run's name in the rows (default: the model's)")
    p.add_argument("--out", required=True, help="JSON lines file (the planner's log beside it, .planner.log)")
    args = p.parse_args(argv)
    if args.rate_hz <= 0 or args.duration_s <= 0:
        p.error("--rate-hz and --duration-s must be positive")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
