"""The planner node's parameter values (``settings["mode"]``) and the core settings derived from them
(``settings.image_limits``, ...), built when the values change, never per frame: a frame reads one snapshot.
``wam_diff2_core.params.planner`` holds the table and the conversions the offline evaluator shares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from wam_diff2_core.frame_inputs import InputSettings
from wam_diff2_core.geometry import CameraMount
from wam_diff2_core.images import ImageLimits
from wam_diff2_core.params import planner as params
from wam_diff2_core.params.spec import CONFIGURE, settings_from
from wam_diff2_core.speed_profile import ProfileLimits


@dataclass(frozen=True)
class PlannerSettings:
    values: Mapping[str, Any]                # every parameter by name
    inputs: InputSettings                    # odometry, route and command -> the policy's inputs
    image_limits: ImageLimits                # frames larger than these are skipped before decoding
    profile_limits: ProfileLimits            # ~/output/autoware_trajectory's speed profile
    decoding_overrides: dict[str, Any]       # the decoding.* values set (unset: the checkpoint's apply)
    camera_mount: CameraMount                # where the debug image's camera sits on the ego

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> PlannerSettings:
        """Raises ValueError where a value is outside its core setting's range (the spec table's ranges
        keep every value that passed validation inside)."""
        return cls(dict(values), params.input_settings(values), params.image_limits(values),
                   params.profile_limits(values), params.decoding_overrides(values),
                   settings_from(CameraMount, values, "camera."))

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def with_values(self, changed: Mapping[str, Any]) -> PlannerSettings:
        return PlannerSettings.from_values({**self.values, **changed})

    def configure_errors(self) -> list[str]:
        """What keeps these values from loading a model: each validation error, an empty ``model_path``."""
        errors = [str(e) for e in params.validate_values(self.values)]
        if not self["model_path"]:
            errors.append("model_path: empty; set it to a checkpoint directory")
        return errors


def policy_arguments(values: Mapping[str, Any]) -> dict[str, Any]:
    """``DrivingPolicy.from_checkpoint``'s arguments for the (validated) ``configure`` parameter values."""
    return dict(path=values["model_path"], device=values["device"], dtype=values["dtype"],
                overrides=params.decoding_overrides(values), tasks=params.TASKS[values["tasks"]],
                detection_classes=tuple(values["detection_classes"]),
                detection_every_n_frames=values["detection_every_n_frames"],
                min_pixels=values["image.min_pixels"] or None, max_pixels=values["image.max_pixels"] or None,
                max_waypoint_abs_m=values["max_waypoint_abs_m"], parse_retry=values["parse_retry"],
                engine=params.engine_settings(values), candidates=params.candidate_settings(values))


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
