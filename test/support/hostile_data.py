"""Hostile inputs for the tests: an oversized PNG that is tiny on disk, a samples file that mixes
every kind of bad record with good ones (test_hostile_data.py and the per-module tests), and a
SIGKILL at a chosen moment of a subprocess."""
from __future__ import annotations

import json
import signal
import struct
import subprocess
import time
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from wam_diff2_core.outputs.prompts import format_planning_prompt

ANSWER = "2.26,-0.17,4.43,-0.70,6.52,-1.55,8.48,-2.64,10.28,-3.88,11.99,-5.25,13.76,-6.83,15.59,-8.59"


def huge_png(width: int = 20000, height: int = 20000) -> bytes:
    """A valid 1-bit greyscale PNG of width x height, all black: ~50 KB for 20000 x 20000, which
    decodes to 1.2 GB of RGB. Written row block by row block: never a full-size buffer here."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" * (1 + (width + 7) // 8)          # filter byte + packed bits
    packer = zlib.compressobj(9)
    block = row * 256
    idat = b"".join(packer.compress(block) for _ in range(height // 256))
    idat += packer.compress(row * (height % 256)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)   # bit depth 1, greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def planning_record(sample_id, image: str | list | None, *, placeholder: bool = True) -> dict:
    turn = format_planning_prompt("straight", (4.0, 0.1), (0.2, -0.1))
    return {"id": sample_id, "image": image, "conversations": [
        {"from": "human", "value": turn if placeholder else turn.replace("<image>", "")},
        {"from": "gpt", "value": ANSWER}]}


# id -> what is wrong with it (the fuzz test checks each bad record's error mentions this)
BAD_CASES = {
    "oversized": "image refused: too_large",
    "undecodable": "cannot read image: decode_failed",
    "missing-image": "img/nope.png",                         # infer: unreadable; training: not found
    "#4": "a JSON array, expected an object",               # a non-object record (record 4, line 4)
    "#5": "invalid JSON",                                   # a broken line
    "wrong-types": "'image' must be a path or a list of paths",
    "unhashable-role": "turn 0 needs 'from'",
    "#8": "'id' must be a non-empty string or an integer",
    "twice": "is not unique (line 9; line 11)",
    "placeholder-mismatch": "0 <image> placeholder(s) but 1 image path(s)",
}
GOOD_IDS = ("good-0", "good-1", "good-2", "good-3")


def write_hostile_dataset(root: Path, image_size: tuple[int, int] = (128, 72)) -> Path:
    """``root/hostile.jsonl``: the GOOD_IDS (decodable) mixed with one record of each BAD_CASES,
    images under ``root/img``. Returns the file."""
    img = root / "img"
    img.mkdir(parents=True, exist_ok=True)
    width, height = image_size
    for i in range(len(GOOD_IDS)):
        rng = np.random.default_rng(i)
        Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8)).save(img / f"{i}.png")
    (img / "huge.png").write_bytes(huge_png())
    (img / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    lines = [
        json.dumps(planning_record("good-0", "img/0.png")),                                    # line 1
        json.dumps(planning_record("oversized", ["img/huge.png"])),                            # 2
        json.dumps(planning_record("undecodable", ["img/broken.png"])),                        # 3
        json.dumps([planning_record("in-a-list", ["img/1.png"])]),                             # 4: #4
        '{"id": "broken-line", "image": ["img/1.png"], "conversations": [',                    # 5: #5
        json.dumps({**planning_record("wrong-types", None), "image": 7}),                      # 6
        json.dumps({**planning_record("unhashable-role", []), "conversations": [{"from": ["human"], "value": "x"}]}),
        json.dumps({**planning_record(["a", "list"], ["img/1.png"])}),                         # 8: #8
        json.dumps(planning_record("twice", ["img/1.png"])),                                   # 9
        json.dumps(planning_record("good-1", ["img/1.png"])),                                  # 10
        json.dumps(planning_record("twice", ["img/2.png"])),                                   # 11
        json.dumps(planning_record("missing-image", ["img/nope.png"])),                        # 12
        json.dumps(planning_record("placeholder-mismatch", ["img/2.png"], placeholder=False)),  # 13
        json.dumps(planning_record("good-2", ["img/2.png"])),                                  # 14
        json.dumps(planning_record("good-3", "img/3.png")),                                    # 15
    ]
    path = root / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def sigkill_when(cmd: list[str], ready: Callable[[], bool], *, what: str, timeout_s: float = 240.0,
                 **popen) -> None:
    """Run ``cmd`` and kill it with SIGKILL as soon as ``ready()`` holds (polled every 10 ms); fails
    when the process ends first or nothing happens within ``timeout_s`` (``what``: what was awaited)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen)
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read().decode()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
