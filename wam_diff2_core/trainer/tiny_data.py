"""A tiny data set in the authors' sample format, built from code (for tests and smoke runs).

    write_tiny_dataset("/tmp/tiny-data", num_samples=4)   # -> /tmp/tiny-data/train.json + images/

Planning, detection and VQA answers (all text), one small random RGB image per sample.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from ..outputs.prompts import COMMANDS


def _planning_answer(rng: random.Random, waypoints: int) -> str:
    x, y, out = 0.0, 0.0, []
    for _ in range(waypoints):
        x += rng.uniform(0.5, 3.0)
        y += rng.uniform(-0.6, 0.6)
        out += [f"{x:.2f}", f"{y:.2f}"]
    return ",".join(out)


def tiny_records(num_samples: int = 4, seed: int = 0, waypoints: int = 4) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i in range(num_samples):
        kind = ("planning", "detection", "vqa")[i % 3] if i >= 2 else "planning"
        if kind == "planning":
            human = (f"Here is a front-view image: <image>\nThe navigation information is: {COMMANDS[i % 3]}\n"
                     f"The current velocity is: ({rng.uniform(0, 9):.2f},0.00)")
            answer = _planning_answer(rng, waypoints)
        elif kind == "detection":
            human = "<image>\nLocate every car in the image as JSON with bbox_2d and label."
            box = sorted(rng.randint(0, 1000) for _ in range(4))
            answer = '[{"bbox_2d": [%d, %d, %d, %d], "label": "car"}]' % (box[0], box[1], box[2], box[3])
        else:
            human = "<image>\nIs there a vehicle ahead?"
            answer = rng.choice(("Yes, a car is braking in the ego lane.", "No, the lane is clear."))
        records.append({"id": f"tiny-{i:03d}", "datasource": f"tiny-{kind}", "image": [f"images/{i:03d}.png"],
                        "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": answer}]})
    return records


def write_tiny_dataset(out_dir: str | Path, num_samples: int = 4, seed: int = 0, *, waypoints: int = 4,
                       image_size: tuple[int, int] = (32, 48), jsonl: bool = False) -> Path:
    """Write ``train.json`` (or ``train.jsonl``) and its images; returns the data file."""
    import numpy as np
    from PIL import Image

    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    records = tiny_records(num_samples, seed, waypoints)
    rng = np.random.default_rng(seed)
    for rec in records:
        pixels = (rng.random((*image_size, 3)) * 255).astype("uint8")
        Image.fromarray(pixels).save(out / rec["image"][0])
    path = out / ("train.jsonl" if jsonl else "train.json")
    path.write_text("".join(json.dumps(r) + "\n" for r in records) if jsonl else json.dumps(records, indent=1))
    return path
