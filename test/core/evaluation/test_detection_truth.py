"""Detection ground truth from a bag's object boxes (evaluation/bag_detection.py's pixel_truth) is the demo world's own
labels: one derivation (vehicle_projection.VehicleProjector) behind both."""
from __future__ import annotations

import json

import numpy as np
import pytest

from wam_diff2_core.evaluation.bags import Bag
from wam_diff2_core.evaluation.derived_objects import ObjectSnapshot, objects_from_msg
from wam_diff2_core.evaluation.bag_detection import pixel_truth
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
    bag = Bag(tmp_path / "bag")
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


def test_eval_bag_predictions_score_the_nodes_boxes_against_the_bags_objects(tmp_path, capsys):
    """``eval-bag --predictions``: a demo-world bag (objects, /tf, camera_info as synth writes them) and a node's
    recorded Detection2DArray: the demo world's own labels as answers score AP 1; an answer that did not parse
    scores no box (its objects are misses); a message of no camera frame is counted, not scored."""
    from wam_diff2_core.evaluation.bag_types import default_typestore
    from wam_diff2_core.evaluation.bag_writer import write_bag
    from wam_diff2_core.evaluation.bag_detection import DEFAULT_DETECTIONS_TOPIC, DETECTIONS_TYPE
    from wam_diff2_core.evaluation.bag_plan import EvalSettings
    from wam_diff2_core.evaluation.predictions import DEFAULT_TRAJECTORY_TOPIC, evaluate_predictions
    from wam_diff2_core.sim.dataset_export import ExportSettings, export_episode

    es = EpisodeSettings(frames=8, frame_stride=10)
    export_episode(tmp_path, 2, "train", ExportSettings(episodes=1, episode=es, formats=("mcap",), detection=False))
    bag = next((tmp_path / "bags").rglob("metadata.yaml")).parent
    episode = simulate_episode(0, 2, es)
    start_ns = int(round(es.start_time_s * 1e9))
    labels = {start_ns + es.frame_tick(f.truth.frame) * int(round(es.dt_s * 1e9)): f.truth.boxes
              for f in episode.frames()}
    assert sum(len(b) for b in labels.values()) >= 5
    t = default_typestore().types

    def answer(stamp: int, boxes, valid: bool = True):
        header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=stamp // 10**9,
                                                                                  nanosec=stamp % 10**9),
                                          frame_id="hero/rgb_front")
        detections = [t["wam_diff2_ros/msg/Detection2D"](label=b.label, score=1.0, x_min=b.box[0], y_min=b.box[1],
                                                          x_max=b.box[2], y_max=b.box[3]) for b in boxes]
        stages = t["wam_diff2_ros/msg/StageTimes"](header=header, image_ms=1.0, processor_ms=0.0, vision_ms=0.0,
                                                   prefill_ms=0.0, denoise_ms=9.0, commit_ms=0.0, parse_ms=0.0,
                                                   other_ms=0.0, total_ms=10.0, peak_memory_mb=500.0, memory_kind="rss")
        stats = t["wam_diff2_ros/msg/DecodeStats"](block_size=32, forwards=4, denoise_steps=3, blocks=1, tokens=8,
                                                   prefill_ms=1.0, denoise_ms=9.0, commit_ms=0.0, retries=0,
                                                   latency_ms=10.0, stages=stages)
        return t[DETECTIONS_TYPE](header=header, detections=detections, valid=valid,
                                  invalid_reason="" if valid else "no_boxes: garbage", raw_text="", stats=stats), \
            t["wam_diff2_ros/msg/Trajectory"](header=header, points=[], command="straight", valid=False,
                                              invalid_reason="not_asked", raw_text="", stats=stats, candidates=1,
                                              valid_candidates=0, selected_candidate=0, pdms=float("nan"))

    def node_bag(path, answers):
        """The node's recorded outputs: each frame's boxes and its (here invalid) trajectory."""
        topics = {DEFAULT_DETECTIONS_TOPIC: DETECTIONS_TYPE, DEFAULT_TRAJECTORY_TOPIC: "wam_diff2_ros/msg/Trajectory"}
        messages = []
        for stamp, (boxes, traj) in answers:
            messages += [(DEFAULT_DETECTIONS_TOPIC, stamp, boxes), (DEFAULT_TRAJECTORY_TOPIC, stamp + 1, traj)]
        return write_bag(path, topics, messages)

    stamps = sorted(labels)
    seen = [s for s in stamps if labels[s]]
    perfect = node_bag(tmp_path / "perfect", [(s + 1000, answer(s, labels[s])) for s in stamps])
    run = evaluate_predictions([bag], [perfect], EvalSettings())
    d = run.detection
    assert d["counts"]["matched"] == len(stamps) and d["truth_boxes"] == sum(len(b) for b in labels.values())
    assert d["scores"]["ap"] == d["scores"]["ap50"] == 1.0 and d["scores"]["parse_failures"] == 0
    from wam_diff2_core.cli import main
    from wam_diff2_core.evaluation.report_plots import PLOTS
    out = tmp_path / "report"
    assert main(["eval-bag", str(bag), "--predictions", str(perfect), "--out", str(out), "--no-progress"]) == 0
    assert "COCO AP 1.000, AP50 1.000" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["detection"]["scores"]["ap"] == 1.0 and (out / PLOTS["detection"]).is_file()
    assert "## Detection (the node's boxes, COCO AP)" in (out / "report.md").read_text()

    broken = [(s + 1000, answer(s, [], valid=False) if s == seen[0] else answer(s, labels[s])) for s in stamps]
    broken.append((stamps[-1] + 7000, answer(stamps[-1] + 7, [])))
    run = evaluate_predictions([bag], [node_bag(tmp_path / "broken", broken)], EvalSettings())
    d = run.detection
    assert d["counts"]["unmatched_stamp"] == 1 and d["scores"]["parse_failures"] == 1
    missed = len(labels[seen[0]]) / d["truth_boxes"]
    assert d["scores"]["ar100"] == pytest.approx(1.0 - missed, abs=0.02) and d["scores"]["ap"] < 1.0
