"""The planner node's stored inputs (images apart: the node's slot keeps the newest for its worker).

Odometry, route and command go to the core's :class:`FrameInputTracker`, which the offline evaluator
uses too; camera_info and the candidate selection's objects beside it. Thread-safe: one lock over all of it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from wam_diff2_core.candidate_selection import CandidateSettings, OnlineScene
from wam_diff2_core.frame_inputs import NS_PER_S, FrameInputs, FrameInputTracker, InputSettings, InputSkip, \
    image_msg_to_rgb, stamp_ns
from wam_diff2_core.geometry import PinholeCamera
from wam_diff2_core.images import ImageError

from .candidates import CandidateInputs
from .settings import PlannerSettings

IMAGE_STALE = "image_stale"               # InputSkip code: the image stamp is too far from the node's clock


def frame_image(msg, now_ns: int, settings: PlannerSettings) -> np.ndarray:
    """An image message -> [H, W, 3] uint8 RGB. Raises InputSkip: ``image_stale`` where its stamp is more than
    ``image_timeout_s`` from ``now_ns`` (the node's clock), ``image_<ImageError code>`` where it does not decode."""
    age_s = (now_ns - stamp_ns(msg.header.stamp)) / NS_PER_S
    if abs(age_s) > settings["image_timeout_s"]:
        raise InputSkip(IMAGE_STALE, f"image stamp is {age_s:.3f} s from now (image_timeout_s "
                                     f"{settings['image_timeout_s']})")
    try:
        return image_msg_to_rgb(msg, settings.image_limits)
    except ImageError as exc:
        raise InputSkip(f"image_{exc.code}", str(exc)) from exc


@dataclass(frozen=True)
class FrameContext:
    inputs: FrameInputs
    odometry_frame: str                      # the odometry's frame ("" before any)
    child_frame: str                         # the odometry's child frame: the ego frame
    scene: OnlineScene | None                # candidate selection's scene; None with one candidate
    odometry_waited_out: bool                # no odometry at or after the frame's stamp within the wait


class PlannerInputs:
    def __init__(self, settings: InputSettings):
        self._lock = threading.Lock()
        self._odometry_arrived = threading.Condition(self._lock)
        self._tracker = FrameInputTracker(settings)
        self.camera: PinholeCamera | None = None          # the camera received on camera_info, if any
        self.candidates = CandidateInputs(self._lock)   # the objects and the scene candidates are scored in

    def update_settings(self, settings: InputSettings) -> None:
        """Applies from the next message and frame."""
        with self._lock:
            self._tracker.update_settings(settings)

    # the callbacks' stores raise InputSkip for a message they refuse
    def on_odometry(self, msg) -> bool:
        """True: its time went back, the ego history restarted."""
        with self._lock:
            resets = self._tracker.time_resets
            self._tracker.on_odometry(msg)
            self._odometry_arrived.notify_all()
            return self._tracker.time_resets != resets

    def on_route(self, msg) -> bool:
        with self._lock:
            self._tracker.on_route(msg)
        return True

    def on_command(self, msg) -> bool:
        """True: a command, False: text that names none."""
        with self._lock:
            return self._tracker.on_command(msg) is not None

    def wake(self) -> None:
        """A frame waiting for its odometry stops waiting (the worker is stopping)."""
        with self._lock:
            self._odometry_arrived.notify_all()

    def frame_at(self, stamp_ns: int, wait_s: float, stopped: Callable[[], bool],
                 candidates: CandidateSettings) -> FrameContext:
        """The inputs at an image stamp, once odometry at or after it is in (or ``wait_s`` passed, or
        ``stopped()``). Raises InputSkip where the tracker cannot give them."""
        with self._lock:      # held over the route lookup too, once a frame
            def arrived():
                newest = self._tracker.newest_odometry_ns
                return newest is not None and newest >= stamp_ns
            waited_out = not arrived() and not self._odometry_arrived.wait_for(lambda: arrived() or stopped(),
                                                                               wait_s)
            inputs = self._tracker.inputs_at(stamp_ns)
            scene = self.candidates.scene(inputs, self._tracker, candidates) if candidates.count > 1 else None
            return FrameContext(inputs, self._tracker.odometry_frame, self._tracker.child_frame, scene, waited_out)

    def status(self) -> dict:
        """The diagnostics' view: newest odometry stamp, the command text, route points, a camera_info."""
        with self._lock:
            route = self._tracker.route_xy
            return {"odometry_ns": self._tracker.newest_odometry_ns, "command_text": self._tracker.command_text,
                    "route_points": 0 if route is None else len(route), "has_camera_info": self.camera is not None}
