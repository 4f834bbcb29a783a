"""The planner node's parameter values as one typed settings object.

    settings = PlannerSettings.from_values(read_all(node, params.SPECS))
    settings.image_limits, settings.camera_mount, settings.decoding_overrides, ...

The node builds it when its values change (at start and on every accepted parameter set), never
per frame: a frame reads one snapshot whose fields are already the core's settings, and the
ROS names are turned into those settings here only (``wam_diff2_core.params.planner`` holds the
table and the conversions the offline evaluator shares).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from wam_diff2_core.frame_inputs import InputSettings
from wam_diff2_core.geometry import CameraMount
from wam_diff2_core.images import ImageLimits
from wam_diff2_core.params import planner as params
from wam_diff2_core.speed_profile import ProfileLimits


@dataclass(frozen=True)
class PlannerSettings:
    values: Mapping[str, Any]                # every parameter by name: validation, model loading, the status
    inputs: InputSettings                    # odometry, route and command -> the policy's inputs
    image_limits: ImageLimits                # frames larger than these are skipped before decoding
    profile_limits: ProfileLimits            # ~/output/autoware_trajectory's speed profile
    decoding_overrides: dict[str, Any]       # the decoding.* values set (unset: the checkpoint's apply)
    camera_mount: CameraMount                # where the debug image's camera sits on the ego
    mode: str                                # realtime | lockstep
    lockstep_every_n_images: int
    image_timeout_s: float
    odometry_wait_s: float
    ego_frame_id: str                        # empty: the odometry's child frame
    warn_throttle_s: float
    publish_odom_frame_path: bool
    publish_debug_image: bool
    publish_markers: bool
    use_camera_info: bool
    horizontal_fov_deg: float

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> PlannerSettings:
        """Raises ValueError where a value is outside its core setting's range (the spec table's ranges
        keep every value that passed validation inside)."""
        return cls(
            values=dict(values), inputs=params.input_settings(values), image_limits=params.image_limits(values),
            profile_limits=params.profile_limits(values), decoding_overrides=params.decoding_overrides(values),
            camera_mount=CameraMount(values["camera.x_m"], values["camera.y_m"], values["camera.z_m"],
                                     values["camera.roll_deg"], values["camera.pitch_deg"], values["camera.yaw_deg"]),
            mode=values["mode"], lockstep_every_n_images=values["lockstep_every_n_images"],
            image_timeout_s=values["image_timeout_s"], odometry_wait_s=values["odometry_wait_s"],
            ego_frame_id=values["ego_frame_id"], warn_throttle_s=values["warn_throttle_s"],
            publish_odom_frame_path=values["publish_odom_frame_path"],
            publish_debug_image=values["debug.publish_image"], publish_markers=values["debug.publish_markers"],
            use_camera_info=values["camera.use_camera_info"], horizontal_fov_deg=values["camera.horizontal_fov_deg"])

    def with_values(self, changed: Mapping[str, Any]) -> PlannerSettings:
        """A new settings object with some values replaced (this one is left as it was)."""
        return PlannerSettings.from_values({**self.values, **changed})

    @property
    def mode_description(self) -> str:
        """``realtime`` or ``lockstep (every N)``."""
        if self.mode == "lockstep":
            return f"lockstep (every {self.lockstep_every_n_images})"
        return self.mode
