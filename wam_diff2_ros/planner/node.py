"""WAM-Diff2 planner: a lifecycle node, camera + odometry + route/command in, plan and boxes out.

    wam-diff2-planner --ros-args --params-file config/planner.yaml -p model_path:=/path/to/ckpt
    ros2 run wam_diff2_ros wam-diff2-planner --ros-args --params-file config/planner.yaml   # ROS install

Lifecycle: configure loads the model (a failure leaves the node unconfigured, with an ERROR
status and diagnostic, publishing nothing), activate starts the worker, deactivate stops it,
cleanup frees the model. With ``autostart`` (the default) the node configures and activates
itself once its executor spins.

Threads: subscription callbacks only store the newest input (a keep-latest slot for images;
odometry, route and command in :class:`.inputs.PlannerInputs`, around the core's
:class:`wam_diff2_core.frame_inputs.FrameInputTracker`); one worker thread takes the newest frame, asks
for the policy's inputs at its stamp, runs :meth:`wam_diff2_core.policy.DrivingPolicy.step` and
publishes. The offline evaluator derives its inputs with the same tracker and makes the same call, so
its numbers are the node's. Every output carries the input image's stamp. See wam_diff2_ros/README.md;
this file's pieces beside it: wam_diff2_ros/planner/README.md.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from diagnostic_msgs.msg import DiagnosticStatus
from nav_msgs.msg import Odometry
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import CameraInfo
from std_msgs.msg import Float64, Header

from wam_diff2_core.camera_rig import frame_mismatch
from wam_diff2_core.frame_inputs import InputSkip, check_image_msg, stamp_ns
from wam_diff2_core.geometry import TIME_RESET_S
from wam_diff2_core.images import ImageError
from wam_diff2_core.params import planner as params
from wam_diff2_core.policy import describe_engine
from wam_diff2_core.topics import PLANNER_NODE

from .. import conversions as conv
from ..diagnostics import publish_periodically
from ..keep_latest import LatestWorker
from ..msg import PlannerStatus
from ..parameters import declare_all, read_all
from ..qos import LATCHED_QOS, LATEST_RELIABLE_QOS
from ..spinning import run_node
from .candidates import candidate_stats
from .diagnostics import planner_diagnostic_status
from .inputs import FrameContext, PlannerInputs, frame_image
from .interface import INPUT_TOPICS, INPUT_TYPES, OUTPUT_TOPICS, OUTPUT_TYPES, input_qos, raw_image_qos_warning
from .monitor import PlannerMonitor
from .outputs import frame_messages
from .policy import PolicyLoad, describe_policy, free_policy, load_policy
from .settings import PlannerSettings, rejected_change

DEFAULT_EGO_FRAME = "base_link"
SHUTDOWN_WAIT_S = 2.0        # on Ctrl-C, how long to let a decode in flight finish


class PlannerNode(LifecycleNode):
    def __init__(self, node_name: str = PLANNER_NODE, **kwargs: Any):
        super().__init__(node_name, **kwargs)
        self._rejected_overrides = declare_all(self, params.SPECS)
        # replaced whole when a parameter is set: the worker reads one snapshot per frame
        self._settings = settings = PlannerSettings.from_values(read_all(self, params.SPECS))
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)

        self._lock = threading.Lock()            # the model state and its message
        self._monitor = PlannerMonitor(self.get_logger(), settings["warn_throttle_s"])
        self._inputs = PlannerInputs(settings.inputs)
        self._policy = None
        self._load = PolicyLoad()               # the last configure's camera block, fast-path check and times
        self._policy_overrides: dict[str, Any] = {}   # the decoding.* values the loaded policy decodes with
        self._loading = False
        self._active = False
        self._lifecycle = "unconfigured"
        self._model_state, self._model_message = PlannerStatus.UNCONFIGURED, "waiting for configure"
        self._image_qos_warned = False
        self._image_count = itertools.count()    # images since activation or a mode change: lockstep keeps every Nth
        # the worker decodes the newest image message of its slot, one at a time
        self._worker: LatestWorker[Any] = LatestWorker(self._process, self._frame_failed, name="wam_diff2_worker")

        self._image_group = MutuallyExclusiveCallbackGroup()
        self._state_group = MutuallyExclusiveCallbackGroup()
        self._status_pub = self.create_publisher(PlannerStatus, OUTPUT_TOPICS["status"], LATCHED_QOS)
        self.publish_diagnostics = publish_periodically(self, OUTPUT_TOPICS["diagnostics"],
                                                        settings["diagnostics_period_s"], self.diagnostic_status,
                                                        callback_group=MutuallyExclusiveCallbackGroup())
        # Subscriptions and (lifecycle) publishers live as long as the node: destroying entities on
        # cleanup races the executor's wait-set (rclpy raised InvalidHandle in the multi-threaded one's
        # spin thread). Inputs are ignored while nothing is active; outputs publish only when active.
        self._input_subscriptions = self._subscribe_inputs(settings)    # input name -> subscription
        self._outputs = {key: self.create_lifecycle_publisher(kind, OUTPUT_TOPICS[key], LATEST_RELIABLE_QOS)
                         for key, kind in OUTPUT_TYPES.items()}
        self._publish_status()
        # one shot, once the executor spins, so the node answers lifecycle queries while loading
        self._autostart_timer = self.create_timer(0.0, self._autostart) if settings["autostart"] else None

    def _subscribe_inputs(self, settings: PlannerSettings) -> dict[str, Any]:
        image = "image_compressed" if settings["image_transport"] == "compressed" else "image"
        callbacks = {image: self._on_image, "odometry": self._storing(self._store_odometry, "odometry_received"),
                     "route": self._storing(self._inputs.on_route, "routes_received"),
                     "command": self._storing(self._inputs.on_command, "commands_received"),
                     "camera_info": self._on_camera_info, "objects": self._inputs.candidates.on_objects}
        return {name.removesuffix("_compressed"): self.create_subscription(
                    INPUT_TYPES[name], INPUT_TOPICS[name], callback, input_qos(name, settings["image_reliability"]),
                    callback_group=self._image_group if name == image else self._state_group)
                for name, callback in callbacks.items() if name in INPUT_TYPES}

    def _on_set_parameters(self, changed: list) -> SetParametersResult:
        loaded_as = self._lifecycle if self._policy is not None or self._loading else None
        reason = rejected_change(self._settings.values, {p.name: p.value for p in changed}, loaded_as)
        return SetParametersResult(successful=reason is None, reason=reason or "")

    def _after_set_parameters(self, changed: list) -> None:
        known = {p.name: p.value for p in changed if p.name in params.SPECS_BY_NAME}
        for name in known:
            self._rejected_overrides.pop(name, None)
        self._settings = settings = self._settings.with_values(known)
        self._monitor.warn_throttle_s = settings["warn_throttle_s"]
        self._inputs.update_settings(settings.inputs)      # from the next message / frame
        if any(p.name in ("mode", "lockstep_every_n_images") for p in changed):
            self._image_count = itertools.count()

    def _autostart(self) -> None:
        self._autostart_timer.cancel()
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        settings = self._settings
        model_path = settings["model_path"]
        errors = list(self._rejected_overrides.values()) + settings.configure_errors()
        if errors:
            return self._configure_failed("; ".join(errors))
        self._loading = True
        self._set_model_state(PlannerStatus.LOADING, f"loading {model_path}")
        try:
            policy = load_policy(settings.values, self.get_logger(), self._load)
        except Exception as exc:  # any load failure: stay alive, report, publish nothing
            self._loading = False
            self.get_logger().debug(traceback.format_exc())
            return self._configure_failed(f"cannot load {model_path!r}: {exc}")
        self._policy, self._loading = policy, False
        self._policy_overrides = settings.decoding_overrides
        self._lifecycle = "inactive"
        message = describe_policy(policy, model_path)
        self._set_model_state(PlannerStatus.READY, message)
        self.get_logger().info(f"configured in {self._load.times_s['configure_s']:.1f} s "
                               f"({self._load.describe_times()}): {message}")
        return super().on_configure(state)

    def _configure_failed(self, message: str) -> TransitionCallbackReturn:
        self.get_logger().error(f"configure failed: {message}")
        self._set_model_state(PlannerStatus.ERROR, message)
        self._lifecycle = "unconfigured"
        return TransitionCallbackReturn.FAILURE

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        result = super().on_activate(state)       # enables the lifecycle publishers
        self._image_count = itertools.count()
        self._worker.start()
        self._active = True
        self._lifecycle = "active"
        self.get_logger().info(f"active: {self._settings['mode']} mode, {self._settings['image_transport']} images")
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.stop_worker()
        self._lifecycle = "inactive"
        self.get_logger().info("deactivated")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._unload("unconfigured")            # inputs stay: the latched route is not sent again
        self._set_model_state(PlannerStatus.UNCONFIGURED, "model freed; waiting for configure")
        self.get_logger().info("cleaned up: model freed")
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._unload("finalized")
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._unload("unconfigured")
        return TransitionCallbackReturn.SUCCESS

    def _unload(self, lifecycle: str) -> None:
        """Stop the worker, free the model, then be in ``lifecycle``."""
        self.stop_worker()
        free_policy(self._policy)
        self._policy = None
        self._lifecycle = lifecycle

    def stop_worker(self, timeout_s: float = 60.0) -> None:
        """Stop the worker after its current frame (its outputs are still published)."""
        self._active = False
        self._worker.request_stop()
        self._inputs.wake()                      # a frame waiting for its odometry stops waiting
        if not self._worker.join(timeout_s):
            self.get_logger().warning(f"the worker is still decoding after {timeout_s} s; not waiting for it")

    def _on_image(self, msg) -> None:
        self._monitor.image_received(stamp_ns(msg.header.stamp), time.monotonic())
        settings = self._settings
        try:
            check_image_msg(msg, settings.image_limits)
        except ImageError as exc:
            self._monitor.skip(f"image_{exc.code}", str(exc))
            return
        self._check_image_qos(msg, settings)
        if not self._active:
            return
        index = next(self._image_count)
        if settings["mode"] == "lockstep" and index % settings["lockstep_every_n_images"] != 0:
            self._monitor.count("images_skipped_lockstep")
            return
        if self._worker.slot.put(msg):
            self._monitor.count("images_dropped_newer_arrived")

    def _check_image_qos(self, msg, settings: PlannerSettings) -> None:
        """Once: say that large raw frames on best effort are mostly lost (wam_diff2_ros/README.md)."""
        warning = None if self._image_qos_warned else raw_image_qos_warning(msg, settings["image_reliability"])
        if warning is not None:
            self._image_qos_warned = True
            self.get_logger().warning(warning)

    def _store_odometry(self, msg: Odometry) -> bool:
        if self._inputs.on_odometry(msg):              # its time went back
            self._monitor.count("odometry_time_resets")
            self._monitor.warn("odometry_time_reset", "odometry time went back by more than "
                               f"{TIME_RESET_S} s (a replay or simulator restarted): ego history restarted")
        return True

    def _storing(self, store: Callable[[Any], bool], counter: str) -> Callable[[Any], None]:
        """A callback that stores a message, counted as ``counter`` where ``store`` takes it (an InputSkip: a skip)."""
        def callback(msg) -> None:
            try:
                if store(msg):
                    self._monitor.count(counter)
            except InputSkip as skip:
                self._monitor.skip_input(skip)
        return callback

    def _on_camera_info(self, msg: CameraInfo) -> None:
        try:
            self._inputs.camera = conv.camera_info_to_camera(msg)
        except ValueError as exc:
            self._monitor.skip("camera_info_invalid", str(exc))

    def counts(self) -> dict[str, int]:
        return self._monitor.counts()

    def _frame_failed(self, exc: Exception) -> bool:
        """The worker survives anything one frame does, unless the node shut down (Ctrl-C) mid-frame."""
        if not self.context.ok():
            return False          # its outputs have nowhere to go
        self._monitor.count("worker_errors")
        self.get_logger().error(f"frame failed: {exc}\n{traceback.format_exc()}")
        return True

    def _process(self, msg) -> None:
        settings, monitor = self._settings, self._monitor
        t_start = time.perf_counter()
        image_stamp_ns = stamp_ns(msg.header.stamp)
        try:
            t_convert = time.perf_counter()
            rgb = frame_image(msg, self.get_clock().now().nanoseconds, settings)      # [H, W, 3] uint8
            conversion_ms = (time.perf_counter() - t_convert) * 1e3
            mismatch = self._load.camera_rig and frame_mismatch(self._load.camera_rig, rgb.shape[1], rgb.shape[0])
            if mismatch:                             # planned anyway: the user may know better, but is told
                monitor.count("frames_off_camera")
                monitor.warn("frames_off_camera", mismatch)
            frame = self._inputs.frame_at(image_stamp_ns, settings["odometry_wait_s"], self._worker.stopping,
                                          self._policy.candidates)
        except InputSkip as skip:
            monitor.skip_input(skip)
            return
        if frame.odometry_waited_out:
            monitor.count("odometry_wait_expired")
        inputs = frame.inputs
        if inputs.default_because is not None:       # the route gave no command: say why
            monitor.command_defaulted(*inputs.default_because)
        ego_frame = settings["ego_frame_id"] or frame.child_frame or DEFAULT_EGO_FRAME

        if settings.decoding_overrides != self._policy_overrides:
            self._policy.update_settings(**settings.decoding_overrides)
            self._policy_overrides = settings.decoding_overrides
            self.get_logger().info(f"decoding settings now {self._policy.settings}")
        try:
            out = self._policy.step(rgb, inputs.ego, inputs.command, scene=frame.scene)
            if out.stages is not None:           # frame -> trajectory: the conversion above is its first stage
                out.stages = out.stages.with_conversion(conversion_ms)
        except Exception as exc:
            monitor.count("inference_errors")
            self.get_logger().error(f"inference failed: {exc}")
            if "trajectory" in self._outputs:
                self._outputs["trajectory"].publish(conv.invalid_trajectory_msg(
                    image_stamp_ns, ego_frame, inputs.command, f"inference_error: {exc}"))
            return
        if self.context.ok():
            self._publish(msg.header, rgb, frame, ego_frame, out, settings, t_start)

    def _publish(self, header: Header, rgb, frame: FrameContext, ego_frame: str, out, settings: PlannerSettings,
                 t_start: float) -> None:
        """The frame's messages, then its timings; ``rgb`` [H, W, 3] is the decoded image."""
        outputs, inputs = self._outputs, frame.inputs
        camera_info = self._inputs.camera if settings["camera.use_camera_info"] else None
        for name, message in frame_messages(header, rgb, inputs, ego_frame, frame.odometry_frame, out, settings,
                                            camera_info):
            outputs[name].publish(message)
        processing_ms = (time.perf_counter() - t_start) * 1e3
        outputs["processing_ms"].publish(Float64(data=processing_ms))
        if out.stages is not None:
            outputs["stage_times"].publish(conv.stage_times_msg(header, out.stages))
        outputs["latency_ms"].publish(Float64(data=(self.get_clock().now().nanoseconds - inputs.stamp_ns) / 1e6))
        self._monitor.frame_published(out, inputs.command, processing_ms,
                                      candidate_stats(out, self._inputs.candidates), time.monotonic())

    def _set_model_state(self, state: int, message: str) -> None:
        with self._lock:
            self._model_state, self._model_message = state, message
        self._publish_status()
        self.publish_diagnostics()

    def _publish_status(self) -> None:
        with self._lock:
            state, message = self._model_state, self._model_message
        self._status_pub.publish(PlannerStatus(header=Header(stamp=self.get_clock().now().to_msg()), state=state,
                                               model_path=self._settings["model_path"], message=message))

    def diagnostic_status(self) -> DiagnosticStatus:
        # matched on this side: a publisher the graph lists but this reader has not matched yet delivers nothing
        publisher_counts = {name: subscription.get_publisher_count()
                            for name, subscription in self._input_subscriptions.items()}
        with self._lock:
            model_state, model_message = self._model_state, self._model_message
        snapshot = self._monitor.snapshot(
            time.monotonic(), now_ns=self.get_clock().now().nanoseconds, lifecycle=self._lifecycle,
            active=self._active, model_state=model_state, model_message=model_message,
            decoder="none" if self._policy is None else describe_engine(self._policy.engine),
            fast_path_check=self._load.fast_path_check, configure_times=dict(self._load.times_s),
            publisher_counts=publisher_counts, **self._inputs.status())
        return planner_diagnostic_status(self.get_name(), snapshot, self._settings)

    def destroy_node(self) -> None:
        self._unload(self._lifecycle)
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
    """Ctrl-C must not wait for a decode in flight (on a CPU a large model's can take minutes): give the
    worker a moment to finish, then leave (its daemon thread ends with the process). True: still decoding."""
    node.stop_worker(SHUTDOWN_WAIT_S)
    return node._worker.still_running()


if __name__ == "__main__":
    sys.exit(main())
