"""The planner node's parameter values as typed settings objects.

    settings = PlannerSettings.from_values(read_all(node, params.SPECS))
    settings.image_limits, settings.camera_mount, settings.decoding_overrides, ...
    model = ModelSettings.from_values(settings.values)      # once per configure, after validation

The node builds :class:`PlannerSettings` when its values change (at start and on every accepted
parameter set), never per frame: a frame reads one snapshot whose fields are already the core's
settings. :class:`ModelSettings`, what loading the policy takes, is built once in each configure. The
ROS names are turned into those settings here only (``wam_diff2_core.params.planner`` holds the
table and the conversions the offline evaluator shares).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from wam_diff2_core.candidate_selection import CandidateSettings
from wam_diff2_core.config import EngineSettings
from wam_diff2_core.frame_inputs import InputSettings
from wam_diff2_core.geometry import CameraMount
from wam_diff2_core.images import ImageLimits
from wam_diff2_core.params import planner as params
from wam_diff2_core.params.spec import CONFIGURE
from wam_diff2_core.speed_profile import ProfileLimits


@dataclass(frozen=True)
class PlannerSettings:
    values: Mapping[str, Any]                # every parameter by name: validation and ModelSettings
    model_path: str                          # the checkpoint, as the status and diagnostics name it
    autostart: bool
    diagnostics_period_s: float
    image_transport: str                     # raw | compressed
    image_reliability: str                   # best_effort | reliable
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
            values=dict(values), model_path=values["model_path"], autostart=values["autostart"],
            diagnostics_period_s=values["diagnostics_period_s"], image_transport=values["image_transport"],
            image_reliability=values["image_reliability"], inputs=params.input_settings(values), image_limits=params.image_limits(values),
            profile_limits=params.profile_limits(values), decoding_overrides=params.decoding_overrides(values),
            camera_mount=CameraMount(values["camera.x_m"], values["camera.y_m"], values["camera.z_m"],
                                     values["camera.roll_deg"], values["camera.pitch_deg"], values["camera.yaw_deg"]),
            mode=values["mode"], lockstep_every_n_images=values["lockstep_every_n_images"],
            image_timeout_s=values["image_timeout_s"], odometry_wait_s=values["odometry_wait_s"],
            ego_frame_id=values["ego_frame_id"], warn_throttle_s=values["warn_throttle_s"],
            publish_odom_frame_path=values["publish_odom_frame_path"],
            publish_debug_image=values["debug.publish_image"], publish_markers=values["debug.publish_markers"],
            use_camera_info=values["camera.use_camera_info"], horizontal_fov_deg=values["camera.horizontal_fov_deg"])

    def configure_errors(self) -> list[str]:
        """What keeps these values from loading a model: each validation error, an empty ``model_path``."""
        errors = [str(e) for e in params.validate_values(self.values)]
        if not self.model_path:
            errors.append("model_path: empty; set it to a checkpoint directory")
        return errors

    def with_values(self, changed: Mapping[str, Any]) -> PlannerSettings:
        """A new settings object with some values replaced (this one is left as it was)."""
        return PlannerSettings.from_values({**self.values, **changed})

    @property
    def mode_description(self) -> str:
        """``realtime`` or ``lockstep (every N)``."""
        if self.mode == "lockstep":
            return f"lockstep (every {self.lockstep_every_n_images})"
        return self.mode


@dataclass(frozen=True)
class ModelSettings:
    """What loading the policy takes (the ``configure`` parameters), as the core's settings."""

    model_path: str
    device: str                              # auto | cpu | cuda[:N] | npu[:N]
    dtype: str
    tasks: tuple[str, ...]                   # ("plan",), ("detect",) or both
    detection_classes: tuple[str, ...]
    detection_every_n_frames: int            # with both tasks: boxes on frames 1, N+1, ...
    min_pixels: int | None                   # None: the checkpoint's processor decides
    max_pixels: int | None
    max_waypoint_abs_m: float
    parse_retry: str
    engine: EngineSettings
    candidates: CandidateSettings
    decoding_overrides: dict[str, Any]       # the decoding.* values set (unset: the checkpoint's apply)
    warmup: bool                             # check the fast path and decode once while configuring

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ModelSettings:
        """Raises ValueError (the core's ConfigError) where the values do not validate
        (``params.validate_values`` names them)."""
        return cls(
            model_path=values["model_path"], device=values["device"], dtype=values["dtype"],
            tasks=params.TASKS[values["tasks"]], detection_classes=tuple(values["detection_classes"]),
            detection_every_n_frames=values["detection_every_n_frames"],
            min_pixels=values["image.min_pixels"] or None, max_pixels=values["image.max_pixels"] or None,
            max_waypoint_abs_m=values["max_waypoint_abs_m"], parse_retry=values["parse_retry"],
            engine=params.engine_settings(values), candidates=params.candidate_settings(values),
            decoding_overrides=params.decoding_overrides(values), warmup=values["warmup"])


def rejected_change(values: Mapping[str, Any], changed: Mapping[str, Any], loaded_as: str | None) -> str | None:
    """Why setting ``changed`` on top of ``values`` is refused, or None to accept it. ``loaded_as``: the
    lifecycle state while a model is loaded or loading (``configure`` parameters are then refused), else None."""
    if loaded_as is not None:
        for name in changed:
            spec = params.SPECS_BY_NAME.get(name)
            if spec is not None and spec.apply == CONFIGURE:
                return (f"{name} is applied on configure and a model is loaded ({loaded_as}): "
                        "deactivate and clean up the node, set it, then configure again")
    errors = [e for e in params.validate_values({**values, **changed}) if set(e.names) & set(changed)]
    return "; ".join(str(e) for e in errors) or None
