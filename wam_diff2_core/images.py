"""Camera frames in, RGB arrays out (and a debug drawing back): no ROS, no cv_bridge.

The model sees RGB. Cameras send ``bgra8`` (CARLA), ``bgr8``, ``rgb8``, ``rgba8`` or ``mono8``
rows, possibly padded (``step`` > width x channels), or JPEG/PNG bytes. Every check a raw
frame can fail has an error code, so a node can count skipped frames by cause.

    >>> row = bytes([10, 20, 30, 255]) + bytes(2)                     # one bgra8 pixel + 2 padding bytes
    >>> image_to_rgb(row * 2, height=2, width=1, encoding="bgra8", step=6).tolist()
    [[[30, 20, 10]], [[30, 20, 10]]]
    >>> image_to_rgb(row, height=2, width=1, encoding="bgra8", step=6)
    Traceback (most recent call last):
    ...
    wam_diff2_core.images.ImageError: size_mismatch: step 6 x height 2 = 12 bytes, data has 6
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# encoding -> (bytes per pixel, channel order that gives R, G, B; None = grey)
ENCODINGS: dict[str, tuple[int, tuple[int, int, int] | None]] = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, None),
}

# Error codes (ImageError.code).
EMPTY = "empty"                              # zero width, height or data
UNSUPPORTED_ENCODING = "unsupported_encoding"
BAD_STEP = "bad_step"                        # a row is shorter than width x bytes per pixel
SIZE_MISMATCH = "size_mismatch"              # step x height != len(data)
DECODE_FAILED = "decode_failed"              # compressed bytes that do not decode


class ImageError(ValueError):
    """A frame that cannot become an RGB array; ``code`` is one of the module's codes."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


def check_raw_image(data_len: int, height: int, width: int, encoding: str, step: int) -> int:
    """Header checks of a raw frame (cheap: no pixels touched). Returns bytes per pixel."""
    if height <= 0 or width <= 0 or data_len == 0:
        raise ImageError(EMPTY, f"{width}x{height} image with {data_len} bytes")
    enc = encoding.lower()
    if enc not in ENCODINGS:
        raise ImageError(UNSUPPORTED_ENCODING, f"{encoding!r} is not one of {', '.join(ENCODINGS)}")
    bpp = ENCODINGS[enc][0]
    if step < width * bpp:
        raise ImageError(BAD_STEP, f"step {step} < width {width} x {bpp} bytes per pixel")
    if step * height != data_len:
        raise ImageError(SIZE_MISMATCH, f"step {step} x height {height} = {step * height} bytes, data has {data_len}")
    return bpp


def image_to_rgb(data, height: int, width: int, encoding: str, step: int) -> np.ndarray:
    """Raw rows (bytes, bytearray, array('B') or a uint8 array) -> [H, W, 3] uint8 RGB, a copy."""
    buffer = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    bpp = check_raw_image(buffer.size, height, width, encoding, step)
    rows = buffer.reshape(height, step)[:, : width * bpp].reshape(height, width, bpp)   # [H, W, bpp] view
    order = ENCODINGS[encoding.lower()][1]
    if order is None:
        return np.repeat(rows, 3, axis=2)
    return np.ascontiguousarray(rows[:, :, list(order)])


def compressed_to_rgb(data) -> np.ndarray:
    """JPEG or PNG bytes (``sensor_msgs/CompressedImage.data``) -> [H, W, 3] uint8 RGB."""
    import cv2

    buffer = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    if buffer.size == 0:
        raise ImageError(EMPTY, "no compressed bytes")
    bgr = cv2.imdecode(buffer, cv2.IMREAD_COLOR)
    if bgr is None or bgr.size == 0:
        raise ImageError(DECODE_FAILED, f"{buffer.size} bytes are not a JPEG/PNG image OpenCV can decode")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


# ----------------------------------------------------------------------------- debug drawing
PLAN_COLOUR = (0, 255, 0)       # RGB
INVALID_COLOUR = (255, 0, 0)
BOX_COLOUR = (255, 200, 0)


def draw_debug_image(rgb: np.ndarray, path_px: np.ndarray | None, boxes: Sequence = (),
                     lines: Sequence[str] = (), valid: bool = True) -> np.ndarray:
    """A copy of ``rgb`` with the projected path, the boxes and a few lines of text drawn.

    ``path_px``: [N, 2] pixels (NaN rows = not visible), the ego origin's projection first when
    wanted. ``boxes``: objects with ``label``, ``score``, ``x_min`` ... ``y_max`` in pixels.
    """
    import cv2

    canvas = np.ascontiguousarray(rgb.copy())
    h, w = canvas.shape[:2]
    thickness = max(1, round(min(h, w) / 150))
    if path_px is not None and len(path_px):
        visible = np.isfinite(path_px).all(axis=1)
        # clamp far-off points so cv2's integer maths stays sane; lines are clipped to the image
        pts = np.clip(np.nan_to_num(path_px), -4 * max(h, w), 4 * max(h, w)).round().astype(np.int32)
        for a, b, ok in zip(pts[:-1], pts[1:], visible[:-1] & visible[1:]):
            if ok:
                cv2.line(canvas, tuple(int(v) for v in a), tuple(int(v) for v in b), PLAN_COLOUR, thickness,
                         cv2.LINE_AA)
        for p, ok in zip(pts, visible):
            if ok:
                cv2.circle(canvas, tuple(int(v) for v in p), thickness + 2, PLAN_COLOUR, -1, cv2.LINE_AA)
    for box in boxes:
        p0 = (int(round(box.x_min)), int(round(box.y_min)))
        p1 = (int(round(box.x_max)), int(round(box.y_max)))
        cv2.rectangle(canvas, p0, p1, BOX_COLOUR, thickness)
        cv2.putText(canvas, f"{box.label} {box.score:.2f}", (p0[0], max(p0[1] - 3, 10)),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.35, BOX_COLOUR, 1, cv2.LINE_AA)
    for i, line in enumerate(lines):
        cv2.putText(canvas, line, (4, 12 + 12 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.35,
                    PLAN_COLOUR if valid else INVALID_COLOUR, 1, cv2.LINE_AA)
    return canvas
