"""Prompt batches shared by the decoder tests: mixed lengths, with and without images."""
from __future__ import annotations

import numpy as np
from PIL import Image

from wam_diff2_core.model.prompt_encoding import encode_prompts

PROMPTS = [
    ("The navigation information is: left\nThe current velocity is: (4.66,-0.09)", True),
    ("Is there a car ahead?", False),
    ("Here is a front-view images from a driving vehicle: predict 8 new waypoints 12.50,-3.25", True),
]


def random_image(seed: int, size=(90, 160)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8))


def encode(processor, idx):
    """A left-padded batch of PROMPTS[i] for i in idx (prompt i's image is (64 + 16 i) x 96)."""
    convs, images = [], []
    for i in idx:
        text, with_image = PROMPTS[i]
        content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": text}]
        convs.append([{"role": "user", "content": content}])
        images.append([random_image(i, (64 + 16 * i, 96))] if with_image else [])
    return encode_prompts(processor, convs, images)
