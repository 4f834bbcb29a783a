"""Camera frames in, RGB arrays out (and a debug drawing back): no ROS, no cv_bridge. Cameras send ``bgra8``
(CARLA), ``bgr8``, ``rgb8``, ``rgba8`` or ``mono8`` rows, possibly padded, or JPEG/PNG bytes; every check a raw
frame can fail has an error code, so a node counts skipped frames by cause. Every image loader refuses an image
over :class:`ImageLimits` from its header, before a pixel is decoded: a hostile 20000 x 20000 PNG (48 KB on
disk, 1.2 GB decoded) is an error for that image, never a crash.

    >>> row = bytes([10, 20, 30, 255]) + bytes(2)                     # one bgra8 pixel + 2 padding bytes
    >>> image_to_rgb(row * 2, height=2, width=1, encoding="bgra8", step=6).tolist()
    [[[30, 20, 10]], [[30, 20, 10]]]
    >>> image_to_rgb(row, height=2, width=1, encoding="bgra8", step=6)
    Traceback (most recent call last):
    ...
    wam_diff2_core.images.ImageError: size_mismatch: step 6 x height 2 = 12 bytes, data has 6
"""
from __future__ import annotations

import io
import re
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Iterator, Sequence

import numpy as np

from .utils.fields import setting

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
TOO_LARGE = "too_large"                      # more pixels or decoded bytes than ImageLimits allow
UNREADABLE = "unreadable"                    # an image file that cannot be opened (missing, no permission)

# What PIL raises for a file it cannot decode, besides its DecompressionBombError (checked apart).
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError)


class ImageError(ValueError):
    """A frame that cannot become an RGB array; ``code`` is one of the module's codes."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True)
class ImageLimits:
    """The largest image any loader decodes, checked from the header (the one place these defaults live: the
    flags, ``data.*`` and ``image.*`` derive from them). Decoded bytes: width x height x the decoded frame's bytes
    per pixel (the source's own, at least the 3 of the RGB copy; a raw frame: ``step`` x ``height`` if more).

    >>> ImageLimits(max_decoded_pixels=1000).check(40, 30, 3, "x.png")
    Traceback (most recent call last):
    ...
    wam_diff2_core.images.ImageError: too_large: x.png is 40x30 = 1200 pixels, above max_decoded_pixels 1000
    """

    # 8K (7680 x 4320) is 33 MP, a 1600 x 900 camera 1.4 MP; 16-bit RGBA (8 bytes per pixel) hits the bytes above 33 MP
    max_decoded_pixels: int = setting(50_000_000, "refuse an image of more pixels (width x height), from its "
                                      "header, before decoding it", low=1, high=2**40)
    max_decoded_bytes: int = setting(256 * 1024 * 1024, "refuse an image that decodes to more bytes (width x height "
                                     "x bytes per pixel, at least 3), from its header", low=1, high=2**40)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{f.name}: must be an integer >= 1, got {value!r}")

    def check(self, width: int, height: int, bytes_per_pixel: int, what: str = "image") -> None:
        """ImageError(TOO_LARGE) naming ``what`` and its size when the image is over a limit."""
        pixels = width * height
        if pixels > self.max_decoded_pixels:
            raise ImageError(TOO_LARGE, f"{what} is {width}x{height} = {pixels} pixels, above max_decoded_pixels "
                                        f"{self.max_decoded_pixels}")
        decoded = pixels * max(3, bytes_per_pixel)
        if decoded > self.max_decoded_bytes:
            raise ImageError(TOO_LARGE, f"{what} is {width}x{height}, {decoded} bytes decoded, above "
                                        f"max_decoded_bytes {self.max_decoded_bytes}")


DEFAULT_LIMITS = ImageLimits()


@contextmanager
def open_image(source: str | Path | IO[bytes], limits: ImageLimits = DEFAULT_LIMITS,
               what: str | None = None) -> Iterator["PIL.Image.Image"]:  # noqa: F821
    """A PIL image whose header was read (no pixel decoded yet) and whose size is within ``limits``. ImageError:
    UNREADABLE, DECODE_FAILED (not an image PIL reads), TOO_LARGE (over ``limits`` or PIL's own bomb limit)."""
    from PIL import Image, ImageMode, UnidentifiedImageError

    what = what or str(source)
    try:
        image = Image.open(source)
    except Image.DecompressionBombError as exc:   # not an OSError: PIL's own limit (2 x MAX_IMAGE_PIXELS)
        raise ImageError(TOO_LARGE, _bomb_message(what, exc, limits)) from None
    except UnidentifiedImageError as exc:
        raise ImageError(DECODE_FAILED, f"{what}: {exc}") from None
    except OSError as exc:
        raise ImageError(UNREADABLE, f"{what}: {exc.strerror or exc}") from None
    except DECODE_ERRORS as exc:
        raise ImageError(DECODE_FAILED, f"{what}: {exc.__class__.__name__}: {exc}") from None
    with image:
        mode = ImageMode.getmode(image.mode)
        limits.check(image.width, image.height, len(mode.bands) * int(mode.typestr[-1]), what)
        yield image


def _bomb_message(what: str, exc: Exception, limits: ImageLimits) -> str:
    """PIL refuses images above 2 x ``PIL.Image.MAX_IMAGE_PIXELS`` at open, before anyone can read
    their size; its message carries the pixel count."""
    found = re.search(r"\((\d+) pixels\)", str(exc))
    if found is None:
        return f"{what}: {exc}"
    pixels = int(found.group(1))
    if pixels > limits.max_decoded_pixels:
        return f"{what} has {pixels} pixels, above max_decoded_pixels {limits.max_decoded_pixels}"
    return f"{what} has {pixels} pixels, more than PIL opens (2 x PIL.Image.MAX_IMAGE_PIXELS)"


def load_rgb(path: str | Path, limits: ImageLimits = DEFAULT_LIMITS):
    """An image file as an RGB PIL image, refused from its header when over ``limits`` (ImageError)."""
    with open_image(path, limits) as image:
        try:
            return image.convert("RGB")
        except DECODE_ERRORS as exc:             # a header that reads, pixel data that does not
            raise ImageError(DECODE_FAILED, f"{path}: {exc.__class__.__name__}: {exc}") from None


def check_raw_image(data_len: int, height: int, width: int, encoding: str, step: int,
                    limits: ImageLimits = DEFAULT_LIMITS) -> int:
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
    limits.check(width, height, max(bpp, -(-data_len // (width * height))), f"a {encoding} frame")
    return bpp


def image_to_rgb(data, height: int, width: int, encoding: str, step: int,
                 limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Raw rows (bytes, bytearray, array('B') or a uint8 array) -> [H, W, 3] uint8 RGB, a copy."""
    buffer = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    bpp = check_raw_image(buffer.size, height, width, encoding, step, limits)
    rows = buffer.reshape(height, step)[:, : width * bpp].reshape(height, width, bpp)   # [H, W, bpp] view
    order = ENCODINGS[encoding.lower()][1]
    if order is None:
        return np.repeat(rows, 3, axis=2)
    return np.ascontiguousarray(rows[:, :, list(order)])


def compressed_to_rgb(data, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """JPEG or PNG bytes (``sensor_msgs/CompressedImage.data``) -> [H, W, 3] uint8 RGB; the size
    is checked against ``limits`` from the header (PIL's lazy open) before OpenCV decodes."""
    import cv2

    buffer = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    if buffer.size == 0:
        raise ImageError(EMPTY, "no compressed bytes")
    try:
        with open_image(io.BytesIO(buffer), limits, f"a compressed image of {buffer.size} bytes"):
            pass
    except ImageError as exc:
        if exc.code != DECODE_FAILED:
            raise
        raise ImageError(DECODE_FAILED, f"{buffer.size} bytes are not a JPEG/PNG image (no header PIL reads)") \
            from None
    bgr = cv2.imdecode(buffer, cv2.IMREAD_COLOR)
    if bgr is None or bgr.size == 0:
        raise ImageError(DECODE_FAILED, f"{buffer.size} bytes are not a JPEG/PNG image OpenCV can decode")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


PLAN_COLOUR = (0, 255, 0)       # RGB
INVALID_COLOUR = (255, 0, 0)
BOX_COLOUR = (255, 200, 0)


def draw_debug_image(rgb: np.ndarray, path_px: np.ndarray | None, boxes: Sequence = (),
                     lines: Sequence[str] = (), valid: bool = True) -> np.ndarray:
    """A copy of ``rgb`` with the projected path (``path_px`` [N, 2] pixels, NaN rows not visible), the boxes
    (``label``, ``score``, ``x_min`` ... ``y_max`` in pixels) and a few lines of text drawn."""
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
