"""A box from the decoder to every output, on checkpoints that really detect (test/support/detector.py), AR
and Block-32: the Python API (DrivingPolicy), ``wam-diff2 infer`` and ``wam-diff2 bench --data`` give the
same boxes with the same scores; the scores are the geometric mean of each box's digits' probabilities as
an independent decode chose them (transformers' greedy ``generate`` for AR, the full-recompute reference
decoder for Block-32); COCO AP of the answered sample is 1.0."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from test.support.detector import memorized_sample
from test.support.reference_decoder import reference_decode
from wam_diff2_core.cli import main
from wam_diff2_core.geometry import EgoMotion
from wam_diff2_core.outputs.parsing import parse_boxes, token_char_confidences
from wam_diff2_core.policy import DrivingPolicy

EGO = EgoMotion(velocity=(5.0, 0.0), acceleration=(0.0, 0.0))
CORNERS = ("x_min", "y_min", "x_max", "y_max")
TOLERANCE = 1e-6          # of a score, between paths that read the same float32 probabilities
MEMORIZERS = {"ar": "box_memorizer", "block32": "block32_box_memorizer"}
pytestmark = pytest.mark.slow         # the memorizers train for ~25 s


@pytest.fixture(scope="module", params=sorted(MEMORIZERS))
def memorized(request):
    """(checkpoint, samples file, the sample, its image as RGB array, its truth boxes in pixels)."""
    checkpoint, samples = request.getfixturevalue(MEMORIZERS[request.param])
    return checkpoint, samples, *memorized_sample(samples)


def same_boxes(boxes, truth) -> bool:
    """Same labels, corners within 1e-6 px (``boxes``: Box objects or their JSON dicts)."""
    rows = [b if isinstance(b, dict) else vars(b) for b in boxes]
    return [b["label"] for b in rows] == [t.label for t in truth] and \
        [b[k] for b in rows for k in CORNERS] == pytest.approx([getattr(t, k) for t in truth for k in CORNERS])


def independent_decode(loaded, inputs) -> tuple[list[int], list[float]]:
    """(answer ids, the probability each was chosen with) from a decoder that is not the package's."""
    config, settings = loaded.config, loaded.config.settings
    if settings.block_size > 1:
        probabilities: list[float] = []
        return reference_decode(loaded.model, config, inputs, settings, None, probabilities), probabilities
    eos = config.eos_token_id
    out = loaded.model.generate(**inputs, max_new_tokens=settings.max_new_tokens, do_sample=False, eos_token_id=eos,
                                pad_token_id=eos, suppress_tokens=list(config.banned_token_ids), output_scores=True,
                                return_dict_in_generate=True)
    ids = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    ids = ids[:ids.index(eos)] if eos in ids else ids
    return ids, [float(torch.softmax(s[0].float(), dim=-1).max()) for s in out.scores[:len(ids)]]


def reference_scores(policy: DrivingPolicy, rgb: np.ndarray) -> list[float]:
    """Each box's score from :func:`independent_decode`'s probabilities, read onto the answer's characters,
    geometric mean over the box's digits."""
    tokenizer = policy.loaded.processor.tokenizer
    ids, probabilities = independent_decode(policy.loaded, policy._inputs([policy.detection_prompt],
                                                                          Image.fromarray(rgb)))
    text = tokenizer.decode(ids, skip_special_tokens=True)
    found = parse_boxes(text, (rgb.shape[1], rgb.shape[0]),
                        char_confidence=token_char_confidences(tokenizer, ids, probabilities, text))
    return [b.score for b in found.boxes]


def test_api_infer_and_bench_write_the_same_scored_boxes(memorized, box_memorizer, tmp_path):
    checkpoint, samples, record, rgb, truth = memorized

    policy = DrivingPolicy.from_checkpoint(checkpoint, device="cpu", dtype="float32", tasks=("detect",))
    detections = policy.step(rgb, EGO, "straight").detections
    assert detections.valid and detections.raw_text == record["conversations"][1]["value"]
    assert same_boxes(detections.boxes, truth)
    scores = [b.score for b in detections.boxes]
    # sure but not certain (1 - score ~ 3e-5 here): a box scored 1.0, as with no score, would fail
    assert all(0.0 < s < 1.0 for s in scores)
    assert scores == pytest.approx(reference_scores(policy, rgb), abs=TOLERANCE)

    predictions = tmp_path / "predictions.jsonl"
    assert main(["infer", "--model", str(checkpoint), "--input", str(samples), "--output", str(predictions),
                 "--device", "cpu"]) == 0
    (written,) = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert written["parse_error"] is None and written["prediction"] == detections.raw_text
    assert same_boxes(written["boxes"], truth)
    assert [b["score"] for b in written["boxes"]] == pytest.approx(scores, abs=TOLERANCE)

    # bench: the AR memorizer's row and, for the Block-32 one, its row at the checkpoint's own threshold
    out = tmp_path / "bench"
    block, threshold = policy.settings.block_size, policy.settings.confidence_threshold
    own_row = ["--block-sizes", str(block), "--thresholds", str(threshold)] if block > 1 else []
    assert main(["bench", "--model", str(checkpoint), "--ar-model", str(box_memorizer[0]), "--data", str(samples),
                 "--tasks", "grounding", "--device", "cpu", *own_row, "--out", str(out)]) == 0
    rows = {r["label"]: r["grounding"] for r in json.loads((out / "bench.json").read_text())["configurations"]}
    assert set(rows) == {"AR"} | ({f"Block-{block} t={threshold}"} if block > 1 else set())
    for grounding in rows.values():
        assert grounding["parse_failures"] == 0
        assert grounding["coco"]["ap"] == grounding["coco"]["ap50"] == grounding["coco"]["vehicles"]["ap50"] == 1.0
    row = rows["AR" if block == 1 else f"Block-{block} t={threshold}"]
    (answered,) = row["per_sample"]
    assert [b["score"] for b in answered["boxes"]] == pytest.approx(scores, abs=TOLERANCE)
    if block > 1:     # several tokens fixed per forward where AR fixes one (~22 here: a step per block)
        assert row["tokens_per_forward"] > 4
