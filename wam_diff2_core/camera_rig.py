"""The front camera a checkpoint expects: image size, horizontal field of view and where it sits on the car (a
model sees images like its training images only through that camera): the checkpoint's ``diffusion_config.json``
``camera`` block, else a named preset (:data:`PRESETS`, by parameter or ``WAM_DIFF2_CAMERA``), read by the
leaderboard agent's ``sensors()`` and the planner's ``camera.*`` parameters. Positions as CARLA places sensors:
from the vehicle's origin, x forward, y left (REP-103; CARLA's y points right), z up, metres; pitch in degrees,
positive looking down.

    rig = rig_for_checkpoint("models/wam-diff2-demo-b32")          # its camera block
    rig = rig_for_checkpoint("/ckpt/without/block", preset="b2d")  # Bench2Drive's front camera
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .config import DIFFUSION_CONFIG_FILE, ConfigError
from .geometry import DEMO_EGO_BOX

CAMERA_ENV = "WAM_DIFF2_CAMERA"          # the preset when neither the checkpoint nor a parameter names one
DEMO_CAMERA_FROM_AXLE_M = 1.7            # the demo world's camera: 1.7 m ahead of the rear axle, 1.6 m up


@dataclass(frozen=True)
class CameraRig:
    width: int                 # pixels
    height: int
    fov_deg: float             # horizontal field of view
    x_m: float                 # from the vehicle's origin, forward
    y_m: float                 # left
    z_m: float                 # up
    pitch_deg: float = 0.0     # positive looks down

    def __post_init__(self):
        for name in ("width", "height"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 16 <= value <= 16384:
                raise ConfigError(f"camera.{name}: expected pixels 16..16384, got {value!r}")
        if not (isinstance(self.fov_deg, (int, float)) and 1.0 <= self.fov_deg <= 179.0):
            raise ConfigError(f"camera.fov_deg: expected degrees 1..179, got {self.fov_deg!r}")
        for name in ("x_m", "y_m", "z_m", "pitch_deg"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or abs(value) > 100.0:
                raise ConfigError(f"camera.{name}: expected a finite number within +-100, got {value!r}")

    @classmethod
    def from_dict(cls, values: dict, where: str) -> "CameraRig":
        known = set(cls.__dataclass_fields__)
        unknown = set(values) - known
        missing = {n for n in known if n != "pitch_deg"} - set(values)
        if unknown or missing:
            raise ConfigError(f"{where}: camera block: unknown {sorted(unknown)}, missing {sorted(missing)}"
                              f" (keys: {', '.join(cls.__dataclass_fields__)})")
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


PRESETS: dict[str, CameraRig] = {
    # Bench2Drive's front camera (its data collection and leaderboard agents): 1600 x 900, fov 70
    "b2d": CameraRig(width=1600, height=900, fov_deg=70.0, x_m=0.80, y_m=0.0, z_m=1.60),
    # the synthetic demo world's camera, which the embedded demo models were trained on
    "demo": CameraRig(width=320, height=180, fov_deg=90.0, x_m=round(DEMO_CAMERA_FROM_AXLE_M - DEMO_EGO_BOX.centre_from_axle_m, 6),
                      y_m=0.0, z_m=1.6),
}


def frame_mismatch(rig: CameraRig, width: int, height: int) -> str | None:
    """Why a ``width`` x ``height`` frame is likely not what the checkpoint saw (None when it is): another
    aspect ratio (more than 10 % off), or a pixel count more than 4x off (the processor resizes within its
    pixel budget, but the scene's scale in the image changes with the camera)."""
    aspect = (width / height) / (rig.width / rig.height)
    pixels = (width * height) / (rig.width * rig.height)
    if abs(aspect - 1.0) <= 0.1 and 0.25 <= pixels <= 4.0:
        return None
    return (f"frame {width}x{height} is far from the checkpoint's camera {rig.width}x{rig.height} (fov {rig.fov_deg:g}): "
            "plans are likely wrong; give the simulator the checkpoint's camera (camera block of "
            f"{DIFFUSION_CONFIG_FILE})")


def planner_camera_arguments(rig: CameraRig, centre_from_axle_m: float) -> dict[str, str]:
    """The leaderboard launch's camera arguments for ``rig``, in the planner's ego frame (the rear axle,
    ``centre_from_axle_m`` behind the vehicle's origin)."""
    return {"camera_fov_deg": str(rig.fov_deg), "camera_x_m": str(rig.x_m + centre_from_axle_m),
            "camera_y_m": str(rig.y_m), "camera_z_m": str(rig.z_m), "camera_pitch_deg": str(rig.pitch_deg)}


def read_camera_block(checkpoint_dir: str | Path) -> CameraRig | None:
    """The ``camera`` block of a checkpoint's diffusion_config.json (None without one); reads JSON only."""
    path = Path(checkpoint_dir) / DIFFUSION_CONFIG_FILE
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({exc})") from None
    block = stored.get("camera") if isinstance(stored, dict) else None
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ConfigError(f"{path}: camera must be an object, got {type(block).__name__}")
    return CameraRig.from_dict(block, str(path))


def preset(name: str) -> CameraRig:
    if name not in PRESETS:
        raise ConfigError(f"camera preset {name!r} is not one of {', '.join(PRESETS)} (NAVSIM's cameras are "
                          "calibrated per log: give a NAVSIM checkpoint a camera block)")
    return PRESETS[name]


def rig_for_checkpoint(checkpoint_dir: str | Path | None, preset_name: str | None = None,
                       environ: dict | None = None) -> CameraRig:
    """The checkpoint's camera block; else the preset named here; else ``WAM_DIFF2_CAMERA``'s; else a
    ConfigError saying how to choose (no silent default: a wrong camera costs every plan)."""
    block = read_camera_block(checkpoint_dir) if checkpoint_dir is not None else None
    if block is not None:
        return block
    import os
    name = preset_name or (environ if environ is not None else os.environ).get(CAMERA_ENV)
    if not name:
        raise ConfigError(f"{checkpoint_dir}: {DIFFUSION_CONFIG_FILE} has no camera block: name a camera preset "
                          f"({', '.join(PRESETS)}) with {CAMERA_ENV}")
    return preset(name)
