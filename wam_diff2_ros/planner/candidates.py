"""The planner's candidate selection inputs (README: candidate selection): the online scene a frame's
``candidates.count`` plans are scored in, from the ego state, the route (``~/input/route``, in the odometry
frame) and the newest ``derived_object_msgs/ObjectArray`` on ``~/input/objects`` (where that package imports),
each object moved on at its velocity. An objects message in another frame than the odometry, or older than
``OBJECTS_MAX_AGE_S`` at the frame, is not used (``last_objects_used`` false in the diagnostics).
"""
from __future__ import annotations

from typing import Any

from wam_diff2_core.candidate_selection import (OBJECTS_MAX_AGE_S, CandidateSettings, OnlineScene, online_scene,
                                                tracked_objects_from_msg)
from wam_diff2_core.frame_inputs import FrameInputs, FrameInputTracker, stamp_ns


class CandidateInputs:
    """The newest objects message and the scene of a frame built from it. :meth:`on_objects` takes the node's
    ``lock``; :meth:`scene` is called holding it."""

    def __init__(self, lock):
        self._lock = lock
        self.objects_msg = None
        self.received = 0
        self.last_objects_used = False

    def on_objects(self, msg) -> None:
        with self._lock:
            self.objects_msg = msg
            self.received += 1

    def scene(self, inputs: FrameInputs, tracker: FrameInputTracker, settings: CandidateSettings) -> OnlineScene:
        ego = inputs.odometry
        odom_frame = tracker.odometry_frame
        route = tracker.route_xy
        if route is not None and tracker.route_frame and odom_frame and tracker.route_frame != odom_frame:
            route = None
        objects, msg = [], self.objects_msg
        self.last_objects_used = False
        if msg is not None and (not odom_frame or str(msg.header.frame_id) in ("", odom_frame)):
            age_s = (inputs.stamp_ns - stamp_ns(msg.header.stamp)) / 1e9
            if abs(age_s) <= OBJECTS_MAX_AGE_S:
                objects = tracked_objects_from_msg(msg, inputs.stamp_ns)
                self.last_objects_used = True
        # yaw rate from the lateral acceleration (v x yaw rate) the prompt gets too
        yaw_rate = ego.ay / ego.vx if abs(ego.vx) > 0.5 else 0.0
        return online_scene((ego.x, ego.y), ego.yaw, ego.vx, ego.ax, yaw_rate, route, objects, settings.lane_width_m)


def candidate_stats(out, inputs: CandidateInputs) -> dict[str, Any]:
    """The diagnostics' ``last_*`` values of a frame's candidate selection (none with one candidate)."""
    if out.candidates <= 1:
        return {}
    selection = out.selection
    stats: dict[str, Any] = {"candidates": out.candidates, "valid_candidates": out.valid_candidates,
                             "objects_used": inputs.last_objects_used, "objects_received": inputs.received}
    if selection is not None:
        best = selection.best
        stats.update(selected_candidate=selection.index + 1, selected_pdms=round(best.pdms, 4),
                     selected_nc=best.nc, selected_dac=best.dac, selected_ttc=best.ttc,
                     selected_ep=round(best.ep, 4), selected_c=best.c)
    return stats
