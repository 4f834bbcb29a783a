"""Bench2Drive round trip: the demo world writes a drive as a Bench2Drive clip (``synth --formats b2d``),
``convert-data bench2drive`` reads it back, and its planning samples equal the demo world's own JSON
export of the same drive (prompt text, waypoints to 1 cm, image bytes). Bad files are reported, never fatal."""
from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from wam_diff2_core.cli import main
from wam_diff2_core.data.bench2drive import anno_acceleration, anno_pose, convert, ego_acceleration, pose_from_anno
from wam_diff2_core.outputs.parsing import parse_waypoints
from wam_diff2_core.sim.camera import CameraSettings
from wam_diff2_core.sim.dataset_export import ExportSettings, export
from wam_diff2_core.sim.episode import EpisodeSettings

FRAMES = 48                      # 4.8 s at 10 Hz: the first 8 frames have 4 s of later frames
SETTINGS = ExportSettings(episodes=2, seed=3, formats=("json", "b2d"), vqa_per_frame=0, detection=False,
                          val_fraction=0.0,
                          episode=EpisodeSettings(frames=FRAMES, frame_stride=2, camera=CameraSettings(160, 90)))


@pytest.fixture(scope="module")
def drive(tmp_path_factory):
    out = tmp_path_factory.mktemp("b2d") / "synth"
    export(out, SETTINGS, progress=False)
    return out


def test_conventions_invert():
    pose = (12.5, -3.25, 2.9)
    assert pose_from_anno(anno_pose(*pose)) == pytest.approx(pose)
    anno = {"acceleration": anno_acceleration(1.5, -0.4, pose[2])}
    assert ego_acceleration(anno, pose[2]) == pytest.approx((1.5, -0.4))
    # CARLA is left-handed: facing north (-y) is compass 0; a car at +x facing +x has theta pi/2
    assert anno_pose(0.0, 0.0, 0.0)["theta"] == pytest.approx(np.pi / 2) and anno_pose(0, 5.0, 0)["y"] == -5.0


def test_converter_output_equals_the_json_export_of_the_same_drive(drive, tmp_path):
    clips = sorted((drive / "b2d").iterdir())
    assert [c.name for c in clips] == ["WamDiff2Synth_seed3_e0000", "WamDiff2Synth_seed3_e0001"]
    assert len(list((clips[0] / "camera" / "rgb_front").glob("*.jpg"))) == FRAMES
    anno = json.loads(gzip.decompress((clips[0] / "anno" / "00000.json.gz").read_bytes()))
    assert {"x", "y", "theta", "speed", "acceleration", "command_near", "bounding_boxes"} <= set(anno)
    assert anno["bounding_boxes"][0]["class"] == "ego_vehicle"
    assert all(len(b["extent"]) == 3 for b in anno["bounding_boxes"][1:])

    summary = convert(drive / "b2d", tmp_path / "out", progress=False)
    samples = json.loads((tmp_path / "out" / "samples.json").read_text())
    assert summary["samples"] == len(samples) == 2 * (FRAMES - 40) and summary["problems"] == 0
    exported = {s["id"]: s for s in json.loads((drive / "train.json").read_text()) if s["task"] == "plan"}
    for s in samples:
        episode, frame = s["id"].split("_e")[1][:4], s["id"].split("-f")[1][:5]
        twin = exported[f"synth3-e{episode}-f{frame}-plan"]
        assert s["conversations"][0]["value"] == twin["conversations"][0]["value"]          # prompt text
        ours = parse_waypoints(s["conversations"][1]["value"]).waypoints
        theirs = parse_waypoints(twin["conversations"][1]["value"]).waypoints
        assert np.abs(ours - theirs).max() <= 0.01 + 1e-9                                     # 1 cm
        assert (tmp_path / "out" / s["image"][0]).read_bytes() == (drive / twin["image"][0]).read_bytes()


def test_missing_and_unreadable_files_are_reported_and_resume_skips_done_clips(drive, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(drive / "b2d", src)
    clip = src / "WamDiff2Synth_seed3_e0000"
    (clip / "camera" / "rgb_front" / "00002.jpg").unlink()                              # missing image
    (clip / "anno" / "00003.json.gz").write_bytes(b"\x1f\x8b broken")                    # unreadable anno
    (clip / "anno" / "00045.json.gz").write_bytes(gzip.compress(b'{"x": 1}'))          # a key missing
    out = tmp_path / "out"
    assert main(["convert-data", "bench2drive", str(clip), str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "3 missing or unreadable files" in printed
    report = json.loads((out / "report.json").read_text())
    problems = report["clips"][clip.name]["problems"]
    assert [(p["frame"], p["reason"].split(":")[0]) for p in problems] == [
        ("00002", "missing"), ("00003", "unreadable"), ("00045", "unreadable")]
    assert "no 'y'" in problems[2]["reason"]
    ids = [s["id"][-10:-5] for s in json.loads((out / "samples.json").read_text())]
    # frame 2 has no image, frame 3 no annotation, 45 is the future of frame 5; the rest are there
    assert ids == ["00000", "00001", "00004", "00006", "00007"]

    assert main(["convert-data", "bench2drive", str(clip), str(out)]) == 2              # no silent overwrite
    assert "already exists" in capsys.readouterr().err
    (out / "parts" / f"{clip.name}.jsonl").write_text('{"id": "kept"}\n')            # marks the clip as done
    assert main(["convert-data", "bench2drive", str(clip), str(out), "--resume", "--no-progress"]) == 0
    assert "(1 converted before)" in capsys.readouterr().out
    assert [s["id"] for s in json.loads((out / "samples.json").read_text())] == ["kept"]
    assert main(["convert-data", "bench2drive", str(tmp_path / "nothing"), str(tmp_path / "o2")]) == 2


def test_b2d_needs_10_hz_frames():
    with pytest.raises(ValueError, match="frame_stride 2"):
        ExportSettings(formats=("b2d",), episode=EpisodeSettings(frame_stride=1))
