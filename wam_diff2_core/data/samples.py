"""The authors' sample format (JSON list or JSONL), as read by inference and training.

    {"id": "43eb...", "datasource": "Navsim", "image": ["relative/path.jpg"],
     "conversations": [{"from": "human", "value": "... <image> ..."}, {"from": "gpt", "value": "2.26,-0.17,..."}]}

``<image>`` placeholders in a turn are replaced by the sample's images in order; image paths
are relative to a data root. Roles: human -> user, gpt -> assistant, system -> system.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..outputs.prompts import IMAGE_PLACEHOLDER

ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


class SampleError(ValueError):
    """A sample is malformed or its images cannot be read; names the sample id."""

    def __init__(self, sample_id: str, message: str):
        super().__init__(f"sample {sample_id}: {message}")
        self.sample_id = sample_id


@dataclass
class Sample:
    id: str
    datasource: str | None
    image_paths: list[Path]
    messages: list[dict[str, Any]]   # every turn, processor chat format
    raw: dict[str, Any]

    @property
    def prompt_messages(self) -> list[dict[str, Any]]:
        """The turns before the last assistant answer (what the model is asked)."""
        last = self._last_answer_index()
        return self.messages if last is None else self.messages[:last]

    @property
    def answer(self) -> str | None:
        """The last assistant answer (the ground truth), if any."""
        last = self._last_answer_index()
        return None if last is None else _text_of(self.messages[last])

    def _last_answer_index(self) -> int | None:
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i]["role"] == "assistant":
                return i
        return None


def _text_of(message: dict[str, Any]) -> str:
    return "".join(item["text"] for item in message["content"] if item["type"] == "text")


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """A JSON list, or JSONL (one object per line). Errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON at line {exc.lineno} ({exc.msg})") from exc
    else:
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: record {i} is a {type(rec).__name__}, expected an object")
    return records


def parse_sample(raw: dict[str, Any], data_root: str | Path = ".", index: int = 0) -> Sample:
    """Validate one record and turn its conversation into processor chat messages."""
    sample_id = str(raw.get("id", f"#{index}"))
    images = raw.get("image", [])
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise SampleError(sample_id, "'image' must be a path or a list of paths")
    turns = raw.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise SampleError(sample_id, "'conversations' must be a non-empty list")
    messages = []
    placeholders = 0
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("from") not in ROLES or not isinstance(turn.get("value"), str):
            raise SampleError(sample_id, f"turn {t} needs 'from' in {sorted(ROLES)} and a string 'value'")
        pieces = turn["value"].split(IMAGE_PLACEHOLDER)
        content: list[dict[str, Any]] = []
        for j, piece in enumerate(pieces):
            if j > 0:
                content.append({"type": "image"})
            if piece:
                content.append({"type": "text", "text": piece})
        placeholders += len(pieces) - 1
        messages.append({"role": ROLES[turn["from"]], "content": content})
    if placeholders != len(images):
        raise SampleError(sample_id, f"{placeholders} <image> placeholder(s) but {len(images)} image path(s)")
    root = Path(data_root)
    return Sample(id=sample_id, datasource=raw.get("datasource"), image_paths=[root / p for p in images],
                  messages=messages, raw=raw)


def iter_samples(path: str | Path, data_root: str | Path = ".") -> Iterator[Sample | SampleError]:
    """Every record as a Sample, or the SampleError that says why it is unusable."""
    for i, raw in enumerate(read_records(path)):
        try:
            yield parse_sample(raw, data_root, i)
        except SampleError as exc:
            yield exc


def load_images(sample: Sample):
    """The sample's images as RGB PIL images; a SampleError names the unreadable file."""
    from PIL import Image, UnidentifiedImageError

    out = []
    for p in sample.image_paths:
        try:
            with Image.open(p) as im:
                out.append(im.convert("RGB"))
        except (OSError, UnidentifiedImageError) as exc:
            raise SampleError(sample.id, f"cannot read image {p} ({exc.__class__.__name__}: {exc})") from exc
    return out
