"""wam_diff2_core.images: raw/compressed frames -> RGB, pinned on tiny arrays; the debug drawing."""
from __future__ import annotations

import array
import doctest
from types import SimpleNamespace

import numpy as np
import pytest

from test.support.hostile_data import huge_png
from wam_diff2_core import images
from wam_diff2_core.images import ImageError, ImageLimits, compressed_to_rgb, draw_debug_image, image_to_rgb, load_rgb

# a 2 x 3 RGB reference image
RGB = np.array([[[1, 2, 3], [4, 5, 6], [7, 8, 9]],
                [[10, 11, 12], [13, 14, 15], [16, 17, 18]]], dtype=np.uint8)


def encode(rgb: np.ndarray, encoding: str, padding: int) -> tuple[bytes, int]:
    """Rows of ``rgb`` in ``encoding`` with ``padding`` junk bytes after each row; (data, step)."""
    h, w, _ = rgb.shape
    alpha = np.full((h, w, 1), 200, np.uint8)
    pixels = {"rgb8": rgb, "bgr8": rgb[:, :, ::-1], "rgba8": np.concatenate([rgb, alpha], 2),
              "bgra8": np.concatenate([rgb[:, :, ::-1], alpha], 2), "mono8": rgb[:, :, :1]}[encoding]
    rows = pixels.reshape(h, -1)
    junk = np.full((h, padding), 0xEE, np.uint8)
    return np.concatenate([rows, junk], axis=1).tobytes(), rows.shape[1] + padding


def test_doctests():
    assert doctest.testmod(images).failed == 0


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
@pytest.mark.parametrize("padding", [0, 1, 5])
def test_colour_encodings_with_any_step(encoding, padding):
    data, step = encode(RGB, encoding, padding)
    out = image_to_rgb(data, 2, 3, encoding, step)
    assert out.dtype == np.uint8 and out.shape == (2, 3, 3) and out.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(out, RGB)


def test_bgra8_pinned_bytes():
    # one row: two bgra8 pixels then 2 padding bytes; the model must see (R, G, B)
    data = bytes([10, 20, 30, 255, 40, 50, 60, 255, 0xAA, 0xBB])
    assert image_to_rgb(data, 1, 2, "bgra8", 10).tolist() == [[[30, 20, 10], [60, 50, 40]]]


@pytest.mark.parametrize("padding", [0, 3])
def test_mono8_becomes_grey_rgb(padding):
    data, step = encode(RGB, "mono8", padding)
    out = image_to_rgb(data, 2, 3, "mono8", step)
    np.testing.assert_array_equal(out, np.repeat(RGB[:, :, :1], 3, axis=2))


def test_accepts_ros_array_and_copies():
    data, step = encode(RGB, "rgb8", 2)
    buf = array.array("B", data)           # what rclpy gives for uint8[]
    out = image_to_rgb(buf, 2, 3, "rgb8", step)
    buf[0] = 99
    assert out[0, 0, 0] == 1               # the result does not alias the message buffer


@pytest.mark.parametrize("data, h, w, encoding, step, code", [
    (b"", 0, 0, "bgra8", 0, images.EMPTY),
    (b"\x00" * 12, 0, 3, "bgra8", 12, images.EMPTY),
    (b"\x00" * 12, 1, 3, "yuv422", 12, images.UNSUPPORTED_ENCODING),
    (b"\x00" * 12, 1, 3, "16UC1", 12, images.UNSUPPORTED_ENCODING),
    (b"\x00" * 13, 1, 3, "bgra8", 12, images.SIZE_MISMATCH),        # step * height != len(data)
    (b"\x00" * 24, 1, 3, "bgra8", 12, images.SIZE_MISMATCH),
    (b"\x00" * 20, 2, 3, "bgra8", 10, images.BAD_STEP),             # a row shorter than 3 x 4 bytes
])
def test_bad_frames_raise_with_a_code(data, h, w, encoding, step, code):
    with pytest.raises(ImageError) as info:
        image_to_rgb(data, h, w, encoding, step)
    assert info.value.code == code


def test_compressed_png_and_jpeg_round_trip():
    import cv2
    rgb = np.zeros((16, 24, 3), np.uint8)
    rgb[:, :12] = (255, 0, 0)                                   # left half red, in RGB
    ok, png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    np.testing.assert_array_equal(compressed_to_rgb(png.tobytes()), rgb)
    ok, jpg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    out = compressed_to_rgb(array.array("B", jpg.tobytes()))
    assert out.shape == rgb.shape and out[8, 2, 0] > 200 and out[8, 2, 2] < 60   # still red, not blue


@pytest.mark.parametrize("data, code", [(b"", images.EMPTY), (b"not an image", images.DECODE_FAILED)])
def test_compressed_failures(data, code):
    with pytest.raises(ImageError) as info:
        compressed_to_rgb(data)
    assert info.value.code == code


# ----------------------------------------------------------------------------- the image-size guard
def _png(rgb: np.ndarray) -> bytes:
    import cv2
    ok, png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    return png.tobytes()


def test_a_20000_square_png_is_refused_from_its_header_never_decoded():
    """48 KB on disk, 1.2 GB of RGB decoded: before the guard, OpenCV decoded it (2.4 GB peak) and
    PIL's DecompressionBombError (not an OSError) crashed infer and training."""
    data = huge_png()
    assert len(data) < 100_000
    with pytest.raises(ImageError) as info:
        compressed_to_rgb(data)
    assert info.value.code == images.TOO_LARGE
    assert "400000000 pixels, above max_decoded_pixels 50000000" in str(info.value)


def test_an_image_between_the_guard_and_pils_own_limit_is_refused_with_its_size(tmp_path):
    path = tmp_path / "big.png"
    path.write_bytes(huge_png(8000, 8000))               # 64 MP: PIL alone would decode it
    with pytest.raises(ImageError, match=r"too_large: .*big\.png is 8000x8000 = 64000000 pixels, above "
                                         r"max_decoded_pixels 50000000"):
        load_rgb(path)


def test_the_limits_are_configurable_pixels_and_decoded_bytes(tmp_path):
    rgb = np.zeros((30, 40, 3), np.uint8)
    assert compressed_to_rgb(_png(rgb)).shape == (30, 40, 3)
    with pytest.raises(ImageError, match="40x30 = 1200 pixels, above max_decoded_pixels 1000"):
        compressed_to_rgb(_png(rgb), ImageLimits(max_decoded_pixels=1000))
    from PIL import Image
    Image.fromarray(np.zeros((30, 40, 4), np.uint8), "RGBA").save(tmp_path / "alpha.png")   # 4 bytes per pixel
    assert load_rgb(tmp_path / "alpha.png", ImageLimits(max_decoded_bytes=4800)).size == (40, 30)
    with pytest.raises(ImageError, match="40x30, 4800 bytes decoded, above max_decoded_bytes 4799"):
        load_rgb(tmp_path / "alpha.png", ImageLimits(max_decoded_bytes=4799))
    data, step = encode(RGB, "bgra8", 4)                     # raw: 2 rows of 16 bytes for 3 pixels each
    assert image_to_rgb(data, 2, 3, "bgra8", step, ImageLimits(max_decoded_bytes=36)).shape == (2, 3, 3)
    with pytest.raises(ImageError) as info:
        image_to_rgb(data, 2, 3, "bgra8", step, ImageLimits(max_decoded_bytes=35))
    assert info.value.code == images.TOO_LARGE and "bgra8 frame is 3x2" in str(info.value)
    with pytest.raises(ImageError, match="above max_decoded_pixels 5"):
        image_to_rgb(data, 2, 3, "bgra8", step, ImageLimits(max_decoded_pixels=5))
    with pytest.raises(ValueError, match="max_decoded_pixels: must be an integer >= 1"):
        ImageLimits(max_decoded_pixels=0)


def test_unreadable_and_undecodable_files_have_their_own_codes(tmp_path):
    with pytest.raises(ImageError) as info:
        load_rgb(tmp_path / "nope.png")
    assert info.value.code == images.UNREADABLE and "nope.png" in str(info.value)
    (tmp_path / "junk.png").write_bytes(b"junk")
    with pytest.raises(ImageError) as info:
        load_rgb(tmp_path / "junk.png")
    assert info.value.code == images.DECODE_FAILED
    (tmp_path / "cut.png").write_bytes(_png(np.full((64, 64, 3), 7, np.uint8))[:120])   # a header, no pixels
    with pytest.raises(ImageError) as info:
        load_rgb(tmp_path / "cut.png")
    assert info.value.code == images.DECODE_FAILED


def test_debug_drawing_marks_the_path_and_boxes_only_on_a_copy():
    frame = np.full((60, 80, 3), 40, np.uint8)
    path = np.array([[40.0, 59.0], [40.0, 30.0], [np.nan, np.nan]])
    box = SimpleNamespace(label="car", score=0.9, x_min=5.0, y_min=5.0, x_max=20.0, y_max=20.0)
    out = draw_debug_image(frame, path, [box], ["left (route) plan ok"])
    assert (frame == 40).all()                                    # input untouched
    assert out.shape == frame.shape and out.dtype == np.uint8
    r, g, b = out[45, 40]                                         # on the drawn segment: the plan's green
    assert g > 200 and r < 60 and b < 60
    assert tuple(out[12, 5]) == images.BOX_COLOUR                 # on the box's left edge
    assert (out[45, 70] == 40).all()                              # away from everything: untouched
    invalid = draw_debug_image(frame, None, [], ["INVALID"], valid=False)
    assert (invalid[..., 0] > invalid[..., 1]).any() and (invalid[40:, :] == 40).all()
