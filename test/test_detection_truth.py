"""Detection ground truth from a bag's object boxes (evaluation/detection_truth.py) is the demo world's own
labels: one derivation (vehicle_projection.VehicleProjector) behind both."""
from __future__ import annotations

import numpy as np
import pytest

from wam_diff2_core.evaluation.bags import open_bag
from wam_diff2_core.evaluation.derived_objects import ObjectSnapshot, objects_from_msg
from wam_diff2_core.evaluation.detection_truth import pixel_truth
from wam_diff2_core.sim.episode import EpisodeSettings, simulate_episode
from wam_diff2_core.sim.episode_bags import EpisodeBagWriter
from wam_diff2_core.vehicle_projection import VehicleProjector

pytest.importorskip("rosbags", reason="bags are written with rosbags (requirements/core.txt)")


def test_a_demo_bags_objects_give_back_the_demo_worlds_labels(tmp_path):
    """Episode (0, 2) with traffic: each tick's vehicles written as carla-ros-bridge's ObjectArray, read back,
    projected from the ego pose: the same boxes (visible and amodal, id, label, visible pixels) as the
    renderer's labels of that tick, occlusion included."""
    settings = EpisodeSettings(frames=12, frame_stride=10)
    episode = simulate_episode(seed=0, index=2, settings=settings)
    cam = episode.settings.camera
    ticks = [settings.frame_tick(f) for f in range(settings.frames)]
    with EpisodeBagWriter(tmp_path / "bag", "mcap", role="hero", camera=cam.camera(), mount=cam.mount) as writer:
        for tick in ticks:
            writer.write_objects(1_000_000_000 + tick * 50_000_000, episode.traffic[tick])
    bag = open_bag(tmp_path / "bag")
    snapshots = [objects_from_msg(msg) for _, _, msg in bag.messages(["/carla/hero/objects"])]
    projector = VehicleProjector(cam.camera(), cam.mount, cam.min_visible_pixels, cam.min_box_side_px)
    compared = 0
    for tick, snapshot in zip(ticks, snapshots, strict=True):
        expected = episode.renderer.render(episode.track.pose(tick), episode.traffic[tick]).boxes
        derived = pixel_truth(snapshot, episode.track.pose(tick), projector)
        assert [(b.id, b.label, b.visible_pixels) for b in derived] == \
            [(b.id, b.label, b.visible_pixels) for b in expected]
        for d, e in zip(derived, expected):
            assert d.box == e.box and np.allclose(d.amodal_box, e.amodal_box, atol=1e-6)
        compared += len(expected)
    assert compared >= 5                                       # the drive sees vehicles


def test_a_snapshot_without_heights_is_refused():
    snapshot = ObjectSnapshot(0, "map", np.array([1]), np.array([[10.0, 0.0, 0.0, 4.5, 1.8]]))
    from wam_diff2_core.geometry import CameraMount, PinholeCamera
    projector = VehicleProjector(PinholeCamera.from_horizontal_fov(320, 180, 90.0), CameraMount(z_m=1.5))
    with pytest.raises(ValueError, match="no box heights"):
        pixel_truth(snapshot, (0.0, 0.0, 0.0), projector)
