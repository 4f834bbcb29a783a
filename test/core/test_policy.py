"""DrivingPolicy's parse retry (an answer that does not parse is decoded once more with another remasking
strategy before it counts as invalid; the retry's cost is counted, its answer is the one kept) and its
detection schedule (with both tasks, boxes every N-th frame)."""
from __future__ import annotations

import pytest

from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.model.prompt_encoding import encode_prompts
from wam_diff2_core.outputs.prompts import format_planning_prompt
from wam_diff2_core.geometry import EgoMotion
from wam_diff2_core.policy import DrivingPolicy

EGO = EgoMotion(velocity=(5.0, 0.0), acceleration=(0.0, 0.0))
SHORT = {"max_new_tokens": 32}      # one block of the random tiny model, whose answers never parse


def _policy(checkpoint, **kwargs) -> DrivingPolicy:
    return DrivingPolicy(load_checkpoint(checkpoint, device="cpu", dtype="float32", overrides=SHORT), **kwargs)


def _direct_decode(policy: DrivingPolicy, frame, strategy: str):
    """The same planning prompt decoded by the decoder alone under ``strategy``."""
    from PIL import Image
    prompt = policy._conversation(format_planning_prompt("straight", EGO.velocity, EGO.acceleration))
    inputs = encode_prompts(policy.loaded.processor, [prompt], [[Image.fromarray(frame)]])
    out = policy.decoder.generate(inputs, policy.settings.replace(remasking_strategy=strategy))
    return policy.loaded.tokenizer.batch_decode(out.sequences, skip_special_tokens=False)[0], out.stats[0]


def test_an_unparseable_answer_is_decoded_again_with_the_retry_strategy(tiny_checkpoint, rgb_frame):
    policy = _policy(tiny_checkpoint, parse_retry="sequential")
    first_text, first = _direct_decode(policy, rgb_frame, "low_confidence_dynamic")
    retry_text, retry = _direct_decode(policy, rgb_frame, "sequential")
    assert first_text != retry_text                 # the retry is another decode, not a repeat

    plan = policy.step(rgb_frame, EGO, "straight").plan
    assert not plan.valid and plan.waypoints is None   # still garbage: still invalid
    assert plan.raw_text == retry_text
    assert plan.stats.retries == 1
    assert plan.stats.forwards == first.forwards + retry.forwards
    assert plan.stats.denoise_steps == first.denoise_steps + retry.denoise_steps
    assert plan.stats.tokens == retry.tokens


def test_no_retry_when_off_or_when_it_would_repeat_the_same_decode(tiny_checkpoint, rgb_frame):
    for kwargs in ({"parse_retry": "none"}, {"parse_retry": "low_confidence_dynamic"}):
        policy = _policy(tiny_checkpoint, **kwargs)
        first_text, first = _direct_decode(policy, rgb_frame, "low_confidence_dynamic")
        plan = policy.step(rgb_frame, EGO, "straight").plan
        assert not plan.valid and plan.stats.retries == 0, kwargs
        assert plan.raw_text == first_text and plan.stats.forwards == first.forwards

    policy = _policy(tiny_checkpoint)            # block size 1: every strategy decodes alike
    policy.update_settings(block_size=1)
    first_text, first = _direct_decode(policy, rgb_frame, "low_confidence_dynamic")
    plan = policy.step(rgb_frame, EGO, "straight").plan
    assert not plan.valid and plan.stats.retries == 0
    assert plan.raw_text == first_text and plan.stats.forwards == first.forwards


def test_detection_answers_are_retried_in_the_same_batch(tiny_checkpoint, rgb_frame):
    policy = _policy(tiny_checkpoint, tasks=("plan", "detect"))
    out = policy.step(rgb_frame, EGO, "straight")
    for result in (out.plan, out.detections):
        assert not result.valid and result.stats.retries == 1


def test_an_unknown_retry_strategy_is_refused_by_name(tiny_checkpoint):
    with pytest.raises(ValueError, match="parse_retry: 'twice'"):
        _policy(tiny_checkpoint, parse_retry="twice")


def test_with_both_tasks_the_boxes_come_every_nth_frame_and_the_plan_every_frame(tiny_checkpoint, rgb_frame):
    policy = _policy(tiny_checkpoint, tasks=("plan", "detect"), parse_retry="none", detection_every_n_frames=3)
    outs = [policy.step(rgb_frame, EGO, "straight") for _ in range(7)]
    assert [o.detections is not None for o in outs] == [True, False, False, True, False, False, True]
    assert all(o.plan is not None for o in outs)
    with pytest.raises(ValueError):
        policy.step(rgb_frame[..., :2], EGO, "straight")        # a refused frame is not counted
    assert policy.step(rgb_frame, EGO, "straight").detections is None and policy.frames == 8


@pytest.mark.parametrize("every, tasks, message", [
    (0, ("plan", "detect"), "detection_every_n_frames: 0 must be a whole number >= 1"),
    (2.0, ("plan", "detect"), "detection_every_n_frames: 2.0 must be a whole number >= 1"),
    (2, ("detect",), r"detection_every_n_frames: 2 needs both tasks \(plan and detect\), tasks are \['detect'\]"),
])
def test_a_bad_detection_schedule_is_refused_by_name(tiny_checkpoint, every, tasks, message):
    with pytest.raises(ValueError, match=message):
        _policy(tiny_checkpoint, tasks=tasks, detection_every_n_frames=every)


class _Answering:
    """The policy's decoder, its answers replaced by ``answer`` with per-token ``confidence(piece)``."""

    def __init__(self, real, tokenizer, answer: str, confidence):
        self.real, self.tokenizer, self.answer, self.confidence = real, tokenizer, answer, confidence

    def __getattr__(self, name):
        return getattr(self.real, name)

    def generate(self, inputs, settings=None, **kwargs):
        from wam_diff2_core.decoding.common import DecodeOutput
        out = self.real.generate(inputs, settings, **kwargs)
        ids = self.tokenizer.encode(self.answer, add_special_tokens=False)
        conf = [self.confidence(self.tokenizer.decode([t])) for t in ids]
        n = len(out.sequences)
        return DecodeOutput(sequences=[ids] * n, finished=[True] * n, stats=out.stats, confidences=[conf] * n)


def test_boxes_score_the_decoders_confidence_in_their_coordinates(tiny_checkpoint, rgb_frame):
    policy = _policy(tiny_checkpoint, tasks=("detect",), parse_retry="none")
    answer = '[{"bbox_2d": [111, 155, 515, 551], "label": "car"}, {"bbox_2d": [666, 699, 969, 996], "label": "car"}]'
    # digits 1 and 5 (box 1's) at 0.5, 6 and 9 (box 2's) at 0.9, anything else certain
    policy.decoder = _Answering(policy.decoder, policy.loaded.tokenizer, answer,
                                lambda piece: {"1": 0.5, "5": 0.5, "6": 0.9, "9": 0.9}.get(piece, 1.0))
    boxes = policy.step(rgb_frame, EGO, "straight").detections.boxes
    assert [b.score for b in boxes] == pytest.approx([0.5, 0.9])
    assert [b.x_min for b in boxes] == pytest.approx([17.76, 106.56])      # 160 px wide frame
