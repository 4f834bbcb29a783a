"""WAM-Diff2 planner: a lifecycle node, camera + odometry + route/command in, plan and boxes out.

    wam-diff2-planner --ros-args --params-file config/planner.yaml -p model_path:=/path/to/ckpt
    ros2 run wam_diff2_ros wam-diff2-planner --ros-args --params-file config/planner.yaml   # ROS install

Lifecycle: configure loads the model (a failure leaves the node unconfigured, with an ERROR
status and diagnostic, publishing nothing), activate starts the worker, deactivate stops it,
cleanup frees the model. With ``autostart`` (the default) the node configures and activates
itself once its executor spins.

Threads: subscription callbacks only store the newest input (a keep-latest slot for images;
odometry, route and command in a :class:`wam_diff2_core.frame_inputs.FrameInputTracker`); one worker
thread takes the newest frame, asks the tracker for the policy's inputs at its stamp, runs
:meth:`wam_diff2_core.policy.DrivingPolicy.step` and publishes. The offline evaluator derives
its inputs with the same tracker and makes the same call, so its numbers are the node's.
Every output carries the input image's stamp. See wam_diff2_ros/README.md.

The pieces without node state live beside it: the topics and QoS (``planner_interface``), the typed
parameter values (``planner_settings``), the configure step (``planner_policy``), a frame's
messages (``planner_outputs``, ``debug_image``) and the diagnostics (``planner_diagnostics``).
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from std_msgs.msg import Float64, Header, String

from wam_diff2_core.geometry import TIME_RESET_S, PinholeCamera
from wam_diff2_core.images import ImageError
from wam_diff2_core.frame_inputs import (OFF_ROUTE, FrameInputs, FrameInputTracker, InputSkip, check_image_msg,
                                         image_msg_to_rgb, is_compressed, stamp_ns)
from wam_diff2_core.params import planner as params
from wam_diff2_core.params.spec import CONFIGURE
from wam_diff2_core.policy import describe_engine
from wam_diff2_core.profiling import stage_summary
from wam_diff2_core.camera_rig import frame_mismatch
from wam_diff2_core.topics import PLANNER_NODE

from . import conversions as conv
from .parameters import declare_all, read_all
from .keep_latest import LatestSlot
from .msg import PlannerStatus
from .optional_msgs import derived_object_msgs
from .planner_candidates import CandidateInputs, candidate_stats
from .planner_diagnostics import SKIP_CAUSES, EventRate, LastPlan, PlannerSnapshot, planner_diagnostic_status
from .planner_interface import (COMMAND_QOS, IMAGE_QOS, INPUT_TOPICS, LARGE_RAW_FRAME_BYTES, OUTPUT_QOS, OUTPUT_TOPICS,
                                OUTPUT_TYPES, ROUTE_QOS, STATUS_QOS)
from .planner_outputs import frame_messages
from .planner_policy import PolicyLoad, free_policy, load_policy
from .planner_settings import PlannerSettings
from .spinning import run_node

DEFAULT_EGO_FRAME = "base_link"
SHUTDOWN_WAIT_S = 2.0        # on Ctrl-C, how long to let a decode in flight finish
STAGE_WINDOW = 100           # frames in the diagnostics' per-stage p50 / p95


class PlannerNode(LifecycleNode):
    def __init__(self, node_name: str = PLANNER_NODE, **kwargs: Any):
        super().__init__(node_name, **kwargs)
        self._rejected_overrides = declare_all(self, params.SPECS)
        # replaced whole when a parameter is set: the worker reads one snapshot per frame
        self._settings = PlannerSettings.from_values(read_all(self, params.SPECS))
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)

        self._lock = threading.Lock()            # counters, the input tracker, camera, status
        self._odometry_arrived = threading.Condition(self._lock)
        self._counts: collections.Counter[str] = collections.Counter()
        self._received_rate, self._processed_rate = EventRate(), EventRate()
        self._last_warn: dict[str, float] = {}
        self._policy = None
        self._load = PolicyLoad()               # the last configure's camera block, fast-path check and times
        self._policy_overrides: dict[str, Any] = {}
        self._loading = False
        self._active = False
        self._lifecycle = "unconfigured"
        self._model_state, self._model_message = PlannerStatus.UNCONFIGURED, "waiting for configure"
        self._image_slot: LatestSlot[Any] = LatestSlot()     # the newest image message
        self._worker: threading.Thread | None = None
        self._abandoned_worker: threading.Thread | None = None     # stopped, still finishing a decode
        self._stop = threading.Event()
        self._init_inputs()
        self._input_subscriptions: dict[str, Any] = {}     # input name -> subscription
        self._outputs: dict[str, Any] = {}

        self._image_group = MutuallyExclusiveCallbackGroup()
        self._state_group = MutuallyExclusiveCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self._status_pub = self.create_publisher(PlannerStatus, OUTPUT_TOPICS["status"], STATUS_QOS)
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, OUTPUT_TOPICS["diagnostics"], 10)
        # wall time: diagnostics keep coming while the simulator is paused (sim time stands still)
        self._diagnostics_timer = self.create_timer(self._settings.values["diagnostics_period_s"],
                                                    self.publish_diagnostics,
                                                    callback_group=self._timer_group,
                                                    clock=Clock(clock_type=ClockType.STEADY_TIME))
        # Subscriptions and (lifecycle) publishers live as long as the node: destroying entities on
        # cleanup races the executor's wait-set (rclpy raised InvalidHandle in the multi-threaded one's
        # spin thread). Inputs are ignored while nothing is active; outputs publish only when active.
        self._make_entities(self._settings.values)
        self._publish_status()
        self._autostart_timer = None
        if self._settings.values["autostart"]:
            # one shot, once the executor spins, so the node answers lifecycle queries while loading
            self._autostart_timer = self.create_timer(0.0, self._autostart)

    # ------------------------------------------------------------------ parameters
    def _on_set_parameters(self, changed: list) -> SetParametersResult:
        names = [p.name for p in changed]
        if self._policy is not None or self._loading:
            for name in names:
                spec = params.SPECS_BY_NAME.get(name)
                if spec is not None and spec.apply == CONFIGURE:
                    return SetParametersResult(successful=False, reason=(
                        f"{name} is applied on configure and a model is loaded ({self._lifecycle}): "
                        "deactivate and clean up the node, set it, then configure again"))
        proposed = {**self._settings.values, **{p.name: p.value for p in changed}}
        errors = [e for e in params.validate_values(proposed) if set(e.names) & set(names)]
        if errors:
            return SetParametersResult(successful=False, reason="; ".join(str(e) for e in errors))
        return SetParametersResult(successful=True)

    def _after_set_parameters(self, changed: list) -> None:
        known = {p.name: p.value for p in changed if p.name in params.SPECS_BY_NAME}
        for name in known:
            self._rejected_overrides.pop(name, None)
        self._settings = settings = self._settings.with_values(known)
        with self._lock:                         # input settings apply from the next message / frame
            self._inputs.update_settings(settings.inputs)
        if any(p.name in ("mode", "lockstep_every_n_images") for p in changed):
            with self._lock:
                self._image_index = 0

    # ------------------------------------------------------------------ lifecycle
    def _autostart(self) -> None:
        self._autostart_timer.cancel()
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        settings = self._settings
        values = settings.values
        errors = list(self._rejected_overrides.values()) + [str(e) for e in params.validate_values(values)]
        if not values["model_path"]:
            errors.append("model_path: empty; set it to a checkpoint directory")
        if errors:
            return self._configure_failed("; ".join(errors))
        self._loading = True
        self._set_model_state(PlannerStatus.LOADING, f"loading {values['model_path']}")
        t0 = time.monotonic()
        try:
            policy = load_policy(settings, self.get_logger(), self._load)
        except Exception as exc:  # any load failure: stay alive, report, publish nothing
            self._loading = False
            self.get_logger().debug(traceback.format_exc())
            return self._configure_failed(f"cannot load {values['model_path']!r}: {exc}")
        self._policy, self._loading = policy, False
        self._policy_overrides = settings.decoding_overrides
        self._lifecycle = "inactive"
        message = (f"{values['model_path']} on {policy.loaded.device} "
                   f"({str(policy.loaded.dtype).replace('torch.', '')}), tasks {'+'.join(policy.tasks)}, "
                   f"block size {policy.settings.block_size}")
        self._load.times_s["configure_s"] = time.monotonic() - t0
        self._set_model_state(PlannerStatus.READY, message)
        times = ", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in self._load.times_s.items()
                          if k != "configure_s")
        self.get_logger().info(f"configured in {self._load.times_s['configure_s']:.1f} s ({times}): {message}")
        return super().on_configure(state)

    def _configure_failed(self, message: str) -> TransitionCallbackReturn:
        self.get_logger().error(f"configure failed: {message}")
        self._set_model_state(PlannerStatus.ERROR, message)
        self._lifecycle = "unconfigured"
        return TransitionCallbackReturn.FAILURE

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        result = super().on_activate(state)       # enables the lifecycle publishers
        with self._lock:
            self._image_index = 0
        self._image_slot.clear()
        self._image_slot.reopen()
        self._stop.clear()
        self._worker = threading.Thread(target=self._worker_loop, name="wam_diff2_worker", daemon=True)
        self._active = True
        self._lifecycle = "active"
        self._worker.start()
        values = self._settings.values
        self.get_logger().info(f"active: {values['mode']} mode, {values['image_transport']} images")
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.stop_worker()
        self._lifecycle = "inactive"
        self.get_logger().info("deactivated")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.stop_worker()
        self._free_policy()                     # inputs stay: the latched route is not sent again
        self._lifecycle = "unconfigured"
        self._set_model_state(PlannerStatus.UNCONFIGURED, "model freed; waiting for configure")
        self.get_logger().info("cleaned up: model freed")
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.stop_worker()
        self._free_policy()
        self._lifecycle = "finalized"
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.stop_worker()
        self._free_policy()
        self._lifecycle = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def worker_running(self) -> bool:
        """True while a stopped worker is still finishing its frame (see stop_worker)."""
        return self._abandoned_worker is not None and self._abandoned_worker.is_alive()

    def stop_worker(self, timeout_s: float = 60.0) -> None:
        """Stop the worker after its current frame (its outputs are still published)."""
        self._active = False
        self._stop.set()
        self._image_slot.close()
        with self._lock:
            self._odometry_arrived.notify_all()      # a frame waiting for its odometry stops waiting
        worker, self._worker = self._worker, None
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout_s)
            if worker.is_alive():
                self._abandoned_worker = worker
                self.get_logger().warning(f"the worker is still decoding after {timeout_s} s; not waiting for it")

    def _free_policy(self) -> None:
        free_policy(self._policy)
        self._policy = None

    def _make_entities(self, values: dict) -> None:
        sub, group = self.create_subscription, self._state_group
        image_qos = IMAGE_QOS[values["image_reliability"]]
        if values["image_transport"] == "compressed":
            image_sub = sub(CompressedImage, INPUT_TOPICS["image_compressed"], self._on_image, image_qos,
                            callback_group=self._image_group)
        else:
            image_sub = sub(Image, INPUT_TOPICS["image"], self._on_image, image_qos, callback_group=self._image_group)
        self._input_subscriptions = {
            "image": image_sub,
            "odometry": sub(Odometry, INPUT_TOPICS["odometry"], self._on_odometry, qos_profile_sensor_data,
                            callback_group=group),
            "route": sub(Path, INPUT_TOPICS["route"], self._on_route, ROUTE_QOS, callback_group=group),
            "command": sub(String, INPUT_TOPICS["command"], self._on_command, COMMAND_QOS, callback_group=group),
            "camera_info": sub(CameraInfo, INPUT_TOPICS["camera_info"], self._on_camera_info, qos_profile_sensor_data,
                               callback_group=group),
            **({"objects": sub(derived_object_msgs.ObjectArray, INPUT_TOPICS["objects"], self._candidate_inputs.on_objects,
                               qos_profile_sensor_data, callback_group=group)} if derived_object_msgs else {}),
        }
        self._outputs = {key: self.create_lifecycle_publisher(kind, OUTPUT_TOPICS[key], OUTPUT_QOS)
                         for key, kind in OUTPUT_TYPES.items()}

    # ------------------------------------------------------------------ input callbacks (store only)
    def _init_inputs(self) -> None:
        # odometry, route and command -> the policy's inputs at an image stamp: the core's tracker,
        # which the offline evaluator uses too. Not thread-safe: every call holds self._lock.
        self._inputs = FrameInputTracker(self._settings.inputs)
        self._camera: PinholeCamera | None = None
        self._last_image_stamp_ns: int | None = None
        self._last_plan: LastPlan | None = None
        self._last_stats: dict[str, float] = {}
        self._candidate_inputs = CandidateInputs(self._lock)   # the objects and the scene candidates are scored in
        self._recent_stages: collections.deque = collections.deque(maxlen=STAGE_WINDOW)   # StageTimes, newest last
        self._image_index = 0
        self._image_qos_warned = False

    def _on_image(self, msg) -> None:
        now = time.monotonic()
        with self._lock:
            self._counts["images_received"] += 1
            self._received_rate.add(now)
            self._last_image_stamp_ns = stamp_ns(msg.header.stamp)
        settings = self._settings
        try:
            check_image_msg(msg, settings.image_limits)
        except ImageError as exc:
            self._skip(f"image_{exc.code}", str(exc))
            return
        self._check_image_qos(msg, settings)
        if not self._active:
            return
        with self._lock:
            index = self._image_index
            self._image_index += 1
        if settings.mode == "lockstep" and index % settings.lockstep_every_n_images != 0:
            self._count("images_skipped_lockstep")
            return
        if self._image_slot.put(msg):
            self._count("images_dropped_newer_arrived")

    def _check_image_qos(self, msg, settings: PlannerSettings) -> None:
        """Once: say that large raw frames on best effort are mostly lost (wam_diff2_ros/README.md)."""
        if self._image_qos_warned or settings.values["image_reliability"] != "best_effort" or is_compressed(msg) \
                or len(msg.data) <= LARGE_RAW_FRAME_BYTES:
            return
        self._image_qos_warned = True
        self.get_logger().warning(
            f"raw {msg.width}x{msg.height} frames ({len(msg.data)} bytes) on best-effort image QoS: over Fast DDS "
            f"most frames above about {LARGE_RAW_FRAME_BYTES} bytes never arrive (wam_diff2_ros/README.md, image "
            "QoS); with a reliable camera publisher (carla-ros-bridge) set image_reliability: reliable")

    def _on_odometry(self, msg: Odometry) -> None:
        try:
            with self._lock:
                resets = self._inputs.time_resets
                self._inputs.on_odometry(msg)
                self._counts["odometry_received"] += 1
                restarted = self._inputs.time_resets != resets
                self._odometry_arrived.notify_all()
                if restarted:
                    self._counts["odometry_time_resets"] += 1
        except InputSkip as skip:
            self._skip_input(skip)
            return
        if restarted:
            self._warn("odometry_time_reset", "odometry time went back by more than "
                       f"{TIME_RESET_S} s (a replay or simulator restarted): ego history restarted")

    def _on_route(self, msg: Path) -> None:
        try:
            with self._lock:
                self._inputs.on_route(msg)
                self._counts["routes_received"] += 1
        except InputSkip as skip:
            self._skip_input(skip)

    def _on_command(self, msg: String) -> None:
        try:
            with self._lock:
                if self._inputs.on_command(msg) is not None:
                    self._counts["commands_received"] += 1
        except InputSkip as skip:
            self._skip_input(skip)

    def _on_camera_info(self, msg: CameraInfo) -> None:
        try:
            camera = conv.camera_info_to_camera(msg)
        except ValueError as exc:
            self._skip("camera_info_invalid", str(exc))
            return
        with self._lock:
            self._camera = camera

    # ------------------------------------------------------------------ counting and warnings
    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _skip(self, cause: str, message: str) -> None:
        """Count a skipped input by cause and warn at most once per ``warn_throttle_s`` per cause."""
        self._count("skipped_" + cause)
        self._warn(cause, f"skipped input ({cause}): {message}")

    def _skip_input(self, skip: InputSkip) -> None:
        self._skip(SKIP_CAUSES.get(skip.code, skip.code), skip.message)

    def _warn(self, cause: str, message: str) -> None:
        """Log a warning at most once per ``warn_throttle_s`` per cause."""
        now = time.monotonic()
        with self._lock:
            last = self._last_warn.get(cause)
            due = last is None or now - last >= self._settings.warn_throttle_s
            if due:
                self._last_warn[cause] = now
        if due:
            self.get_logger().warning(message)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    # ------------------------------------------------------------------ worker
    def _worker_loop(self) -> None:
        while not self._stop.is_set():
            msg = self._image_slot.take(timeout_s=0.2)
            if msg is None or self._stop.is_set():
                continue
            try:
                self._process(msg)
            except Exception as exc:  # the worker must survive anything one frame does
                if not self.context.ok():
                    return            # shut down (Ctrl-C) mid-frame: its outputs have nowhere to go
                self._count("worker_errors")
                self.get_logger().error(f"frame failed: {exc}\n{traceback.format_exc()}")

    def _process(self, msg) -> None:
        settings = self._settings
        t_start = time.perf_counter()
        image_stamp_ns = stamp_ns(msg.header.stamp)
        age_s = (self.get_clock().now().nanoseconds - image_stamp_ns) / conv.NS_PER_S
        if abs(age_s) > settings.image_timeout_s:
            self._skip("image_stale", f"image stamp is {age_s:.3f} s from now (image_timeout_s "
                                      f"{settings.image_timeout_s})")
            return
        t_convert = time.perf_counter()
        try:
            rgb = image_msg_to_rgb(msg, settings.image_limits)
        except ImageError as exc:
            self._skip(f"image_{exc.code}", str(exc))
            return
        conversion_ms = (time.perf_counter() - t_convert) * 1e3
        mismatch = self._load.camera_rig and frame_mismatch(self._load.camera_rig, rgb.shape[1], rgb.shape[0])
        if mismatch:                                 # planned anyway: the user may know better, but is told
            self._count("frames_off_camera")
            self._warn("frames_off_camera", mismatch)

        try:
            with self._lock:      # held over the route lookup too: ~1.5 ms for a 4000-point route, once a frame
                self._wait_for_odometry(image_stamp_ns, settings.odometry_wait_s)
                inputs = self._inputs.inputs_at(image_stamp_ns)
                odom_frame, child_frame = self._inputs.odometry_frame, self._inputs.child_frame
                candidates = self._policy.candidates
                scene = self._candidate_inputs.scene(inputs, self._inputs, candidates) if candidates.count > 1 else None
        except InputSkip as skip:
            self._skip_input(skip)
            return
        if inputs.default_because is not None:       # the route gave no command: say why
            code, why = inputs.default_because
            if code == OFF_ROUTE:
                self._count("route_off_route")
            elif code in SKIP_CAUSES:
                self._skip(SKIP_CAUSES[code], f"{why}; using default_command")
        command = inputs.command
        ego_frame = settings.ego_frame_id or child_frame or DEFAULT_EGO_FRAME

        self._apply_decoding_changes(settings.decoding_overrides)
        try:
            out = self._policy.step(rgb, inputs.ego, command, scene=scene)
            if out.stages is not None:           # frame -> trajectory: the conversion above is its first stage
                out.stages = out.stages.with_conversion(conversion_ms)
        except Exception as exc:
            self._count("inference_errors")
            self.get_logger().error(f"inference failed: {exc}")
            if "trajectory" in self._outputs:
                self._outputs["trajectory"].publish(
                    conv.invalid_trajectory_msg(image_stamp_ns, ego_frame, command, f"inference_error: {exc}"))
            return
        if self.context.ok():
            self._publish(msg, rgb, inputs, ego_frame, odom_frame, out, settings, t_start)

    def _wait_for_odometry(self, stamp_ns: int, timeout_s: float) -> None:
        """Called holding ``self._lock``: wait until odometry at or after ``stamp_ns`` is in (or the timeout)."""
        def arrived():
            newest = self._inputs.newest_odometry_ns
            return newest is not None and newest >= stamp_ns
        if not arrived() and not self._odometry_arrived.wait_for(
                lambda: arrived() or self._stop.is_set(), timeout_s):
            self._counts["odometry_wait_expired"] += 1

    def _apply_decoding_changes(self, overrides: dict) -> None:
        if overrides == self._policy_overrides:
            return
        self._policy.update_settings(**overrides)
        self._policy_overrides = overrides
        self.get_logger().info(f"decoding settings now {self._policy.settings}")

    def _publish(self, msg, rgb: np.ndarray, inputs: FrameInputs, ego_frame: str, odom_frame: str, out,
                 settings: PlannerSettings, t_start: float) -> None:
        outputs, stamp_ns = self._outputs, inputs.stamp_ns
        plan, detections = out.plan, out.detections
        with self._lock:
            camera_info = self._camera if settings.use_camera_info else None
        for name, message in frame_messages(msg.header, rgb, inputs, ego_frame, odom_frame, out, settings,
                                            camera_info):
            outputs[name].publish(message)
        processing_ms = (time.perf_counter() - t_start) * 1e3
        outputs["processing_ms"].publish(Float64(data=processing_ms))
        if out.stages is not None:
            outputs["stage_times"].publish(conv.stage_times_msg(msg.header, out.stages))
        outputs["latency_ms"].publish(Float64(data=(self.get_clock().now().nanoseconds - stamp_ns) / 1e6))

        with self._lock:
            self._counts["images_processed"] += 1
            self._processed_rate.add(time.monotonic())
            if plan is not None:
                self._counts["plans_valid" if plan.valid else "plan_parse_failures"] += 1
                self._last_plan = LastPlan(plan.valid, plan.invalid_reason, inputs.command)
            if detections is not None:
                self._counts["detections_valid" if detections.valid else "detection_parse_failures"] += 1
            stats = (plan or detections).stats
            self._counts["answers_retried"] += sum(r.stats.retries > 0 for r in (plan, detections) if r is not None)
            self._last_stats = {"forwards": stats.forwards, "denoise_steps": stats.denoise_steps,
                                "tokens": stats.tokens, "block_size": stats.block_size,
                                "policy_ms": round(out.latency_ms, 1), "processing_ms": round(processing_ms, 1),
                                **candidate_stats(out, self._candidate_inputs)}
            if out.stages is not None:
                self._recent_stages.append(out.stages)

    # ------------------------------------------------------------------ status and diagnostics
    def _set_model_state(self, state: int, message: str) -> None:
        with self._lock:
            self._model_state, self._model_message = state, message
        self._publish_status()
        self.publish_diagnostics()

    def _publish_status(self) -> None:
        with self._lock:
            state, message = self._model_state, self._model_message
        self._status_pub.publish(PlannerStatus(header=Header(stamp=self.get_clock().now().to_msg()), state=state,
                                               model_path=self._settings.values["model_path"],
                                               message=message))

    def diagnostic_status(self) -> DiagnosticStatus:
        now_ns = self.get_clock().now().nanoseconds
        now = time.monotonic()
        # matched on this side: a publisher the graph lists but this reader has not matched yet delivers nothing
        publisher_counts = {name: subscription.get_publisher_count()
                            for name, subscription in self._input_subscriptions.items()}
        decoder = "none" if self._policy is None else describe_engine(self._policy.engine)
        with self._lock:
            snapshot = PlannerSnapshot(
                now_ns=now_ns, lifecycle=self._lifecycle, active=self._active, model_state=self._model_state,
                model_message=self._model_message, image_ns=self._last_image_stamp_ns,
                odometry_ns=self._inputs.newest_odometry_ns, received_hz=self._received_rate.hz(now),
                processed_hz=self._processed_rate.hz(now), command_text=self._inputs.command_text,
                route_points=0 if self._inputs.route_xy is None else len(self._inputs.route_xy),
                has_camera_info=self._camera is not None, last_plan=self._last_plan,
                decoder=decoder, fast_path_check=self._load.fast_path_check, last_stats=dict(self._last_stats),
                configure_times=dict(self._load.times_s), publisher_counts=publisher_counts,
                stages=stage_summary(list(self._recent_stages)), counts=dict(self._counts))
        return planner_diagnostic_status(self.get_name(), snapshot, self._settings)

    def publish_diagnostics(self) -> None:
        self._diagnostics_pub.publish(conv.diagnostic_array(self.get_clock().now().to_msg(), self.diagnostic_status()))

    def destroy_node(self) -> None:
        self.stop_worker()
        self._free_policy()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    in_flight = run_node(PlannerNode, args, before_teardown=_release_worker)
    if in_flight:
        # Interpreter finalisation while torch runs in another thread can crash: exit at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _release_worker(node: PlannerNode) -> bool:
    """Ctrl-C must not wait for a decode in flight (a 2B prefill on CPU takes a minute): give the worker
    a moment to finish, then leave (its daemon thread ends with the process). True: still decoding."""
    node.stop_worker(SHUTDOWN_WAIT_S)
    return node.worker_running()


if __name__ == "__main__":
    sys.exit(main())
