"""Per-stage times of a policy step: the stages account for the frame-to-trajectory time.

A real ``sensor_msgs/Image`` (bgra8) is converted as the node and eval-bag convert it, then
``DrivingPolicy.step`` plans on it (the tiny Qwen3-VL checkpoint, plain and static decoders, a
parse retry included since the random model's answers never parse). The seven stages must sum
to the measured wall time from message to trajectory within 5 %.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from wam_diff2_core.config import EngineSettings
from wam_diff2_core.evaluation.bag_types import default_typestore
from wam_diff2_core.frame_inputs import image_msg_to_rgb
from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.geometry import EgoMotion
from wam_diff2_core.policy import DrivingPolicy
from wam_diff2_core.profiling import STAGES, PeakMemory, StageTimes

EGO = EgoMotion(velocity=(5.0, 0.0), acceleration=(0.0, 0.0))


def image_msg(rgb: np.ndarray):
    t = default_typestore().types
    h, w = rgb.shape[:2]
    bgra = np.concatenate([rgb[..., ::-1], np.full((h, w, 1), 255, np.uint8)], axis=2)
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=1, nanosec=0), frame_id="cam")
    return t["sensor_msgs/msg/Image"](header=header, height=h, width=w, encoding="bgra8", is_bigendian=0,
                                      step=4 * w, data=bgra.reshape(-1))


@pytest.mark.parametrize("implementation", ["plain", "static"])
def test_stages_sum_to_the_frame_to_trajectory_time(tiny_checkpoint, rgb_frame, implementation):
    policy = DrivingPolicy(load_checkpoint(tiny_checkpoint, device="cpu", dtype="float32",
                                           overrides={"max_new_tokens": 32}),
                           engine=EngineSettings(implementation=implementation), parse_retry="sequential")
    msg = image_msg(rgb_frame)
    policy.step(rgb_frame, EGO, "straight")                 # warm-up: first-call costs are not a stage
    measured, summed = 0.0, 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        tc = time.perf_counter()
        rgb = image_msg_to_rgb(msg)
        conversion_ms = (time.perf_counter() - tc) * 1e3
        out = policy.step(rgb, EGO, "straight")
        measured += (time.perf_counter() - t0) * 1e3
        stages = out.stages.with_conversion(conversion_ms)
        summed += stages.stage_sum_ms
        assert np.array_equal(rgb, rgb_frame)
        assert out.plan.stats.retries == 1                  # both decodes' stages are in
        for s in STAGES:                                   # one block: no commit forward after the last
            assert getattr(stages, f"{s}_ms") > 0 or s == "commit", s
        # the vision tower runs inside the decoder's prefill; the text prefill is the rest of it
        assert stages.vision_ms + stages.prefill_ms == pytest.approx(out.plan.stats.prefill_ms, rel=1e-6)
        assert stages.denoise_ms == pytest.approx(out.plan.stats.denoise_ms)
        assert stages.total_ms == pytest.approx(out.latency_ms + conversion_ms)
        assert stages.memory_kind in ("rss", "rss_since_start") and stages.peak_memory_mb > 50
    assert abs(summed - measured) <= 0.05 * measured, (summed, measured)


def test_stage_times_round_trip_and_peak_memory_resets():
    s = StageTimes(image_ms=1.0, processor_ms=2.0, parse_ms=0.5, total_ms=4.0, peak_memory_mb=10.0, memory_kind="rss")
    assert StageTimes.from_dict(s.as_dict()) == s and s.stage_sum_ms == 3.5
    assert s.with_conversion(2.0).image_ms == 3.0 and s.with_conversion(2.0).total_ms == 6.0
    import torch
    memory = PeakMemory(torch.device("cpu"))
    memory.reset()
    before = memory.peak_mb()
    block = np.ones(64 * 2**20, np.uint8)                  # 64 MB touched
    assert memory.peak_mb() >= before + 60
    del block
    if memory.kind == "rss":                               # the peak resets to the current RSS
        memory.reset()
        assert memory.peak_mb() < before + 60


def test_bench_prints_the_decode_calls_per_stage(tmp_path, capsys):
    """The random-weight bench (text prompts): prefill / denoise / commit p50 / p95 of the timed calls."""
    import json

    from wam_diff2_core.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "--shape", "tiny", "--device", "cpu", "--threads", "1", "--prompt-lengths", "16",
                 "--repeats", "2", "--new-tokens", "16", "--block-size", "8", "--variants", "plain",
                 "--json", str(out)]) == 0
    assert "4. per stage of those calls" in capsys.readouterr().out
    rows = json.loads(out.read_text())["decode"]
    block = next(r for r in rows if r["mode"] == "Block-8")
    assert block["prefill_p50_ms"] > 0 and block["denoise_p95_ms"] >= block["denoise_p50_ms"] > 0
    assert block["commit_p50_ms"] > 0                       # 16 tokens = two blocks: one commit forward
