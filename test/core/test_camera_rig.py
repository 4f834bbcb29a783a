"""The camera a checkpoint expects (wam_diff2_core/camera_rig.py): its diffusion_config.json camera block,
else a named preset; the demo models carry the demo world's camera, which the simulator renders with."""
from __future__ import annotations

import json
import shutil

import pytest

from test.support import REPO_ROOT as ROOT
from wam_diff2_core.camera_rig import CAMERA_ENV, PRESETS, CameraRig, read_camera_block, rig_for_checkpoint
from wam_diff2_core.config import ConfigError
from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.sim.camera import CameraSettings

DEMO = ROOT / "models" / "wam-diff2-demo-b32"


def test_the_demo_model_carries_the_camera_the_demo_world_renders_with():
    rig, world = read_camera_block(DEMO), CameraSettings()
    assert rig == PRESETS["demo"]
    assert (rig.width, rig.height, rig.fov_deg) == (world.width, world.height, world.horizontal_fov_deg)
    assert rig.z_m == world.mount.z_m and rig.x_m == pytest.approx(0.3)       # 1.7 m ahead of the axle
    assert load_checkpoint(DEMO, device="cpu", dtype="float32").config.block_size == 32   # the block loads


def test_the_block_wins_over_a_preset_and_a_preset_over_nothing(tiny_checkpoint):
    assert rig_for_checkpoint(DEMO, "b2d") == PRESETS["demo"]
    assert rig_for_checkpoint(tiny_checkpoint, "b2d") == PRESETS["b2d"]
    assert rig_for_checkpoint(tiny_checkpoint, environ={CAMERA_ENV: "demo"}) == PRESETS["demo"]
    with pytest.raises(ConfigError, match=f"no camera block.*{CAMERA_ENV}"):
        rig_for_checkpoint(tiny_checkpoint, environ={})


@pytest.mark.parametrize("change,message", [
    ({"width": 0}, "camera.width"), ({"fov_deg": 200.0}, "camera.fov_deg"), ({"z_m": float("nan")}, "camera.z_m"),
    ({"height": 9.5}, "camera.height"), ({"lens": "fisheye"}, "unknown \\['lens'\\]")])
def test_a_bad_camera_block_is_refused_naming_the_file_and_field(tmp_path, change, message):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(DEMO, ckpt)
    stored = json.loads((ckpt / "diffusion_config.json").read_text())
    stored["camera"].update(change)
    (ckpt / "diffusion_config.json").write_text(json.dumps(stored))
    with pytest.raises(ConfigError, match=message) as caught:
        read_camera_block(ckpt)
    assert "diffusion_config.json" in str(caught.value)


def test_a_missing_field_is_named():
    with pytest.raises(ConfigError, match="missing \\['fov_deg'\\]"):
        CameraRig.from_dict({"width": 100, "height": 50, "x_m": 0, "y_m": 0, "z_m": 1}, "here")


def test_a_frame_far_from_the_camera_is_named():
    from wam_diff2_core.camera_rig import frame_mismatch
    b2d = PRESETS["b2d"]
    assert frame_mismatch(b2d, 1600, 900) is None and frame_mismatch(b2d, 1280, 720) is None
    assert "frame 800x600 is far from the checkpoint's camera 1600x900" in frame_mismatch(b2d, 800, 600)   # aspect
    assert frame_mismatch(b2d, 320, 180) is not None                                                        # 25x fewer
