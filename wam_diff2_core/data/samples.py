"""The authors' sample format (JSON list or JSONL), as read by inference and training (docs/checkpoints.md).

    {"id": "43eb...", "datasource": "Navsim", "image": ["relative/path.jpg"],
     "conversations": [{"from": "human", "value": "... <image> ..."}, {"from": "gpt", "value": "2.26,-0.17,..."}]}

``<image>`` placeholders are replaced by the sample's images in order. Image paths are relative to a data root
and stay inside it: one that is absolute (unless ``allow_absolute_paths``) or leaves it through ``..`` is
refused from the text alone, so the error is the same whether such a file exists or not; a symlink under the
root is followed. Hostile data never stops a run: each unusable record (not JSON, a wrong field, an id not
unique in its file, an image missing, undecodable or over the :class:`~wam_diff2_core.images.ImageLimits`) is
its own :class:`SampleError` naming the sample and its line; only an unreadable file, or a JSON list that does
not parse as a whole, fails the whole file.

    for item in iter_samples("eval.jsonl", data_root="data/"):
        if isinstance(item, SampleError): print(item)          # sample #3 (line 4): invalid JSON (...)
        else: images = load_images(item)                        # or a SampleError naming the file
"""
from __future__ import annotations

import codecs
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..images import DEFAULT_LIMITS, TOO_LARGE, ImageError, ImageLimits, load_rgb
from ..outputs.parsing import format_waypoints
from ..outputs.prompts import IMAGE_PLACEHOLDER, chat_content, format_planning_prompt

ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
ALLOW_ABSOLUTE_IMAGE_PATHS = False        # the default of every entry point's flag / setting
ALLOW_ABSOLUTE_IMAGE_PATHS_HELP = ("read image paths that are absolute in the samples (default: only paths "
                                   "inside the data root; '..' never leaves it)")


class SampleError(ValueError):
    """A sample is malformed or its images cannot be read; names the sample id and where it is
    (``where``: "line 7" in JSONL, "record 3, line 1" in a JSON list; ``line``: the line number)."""

    def __init__(self, sample_id: str, message: str, where: str | None = None, line: int | None = None):
        super().__init__(f"sample {sample_id}{f' ({where})' if where else ''}: {message}")
        self.sample_id, self.reason, self.where, self.line = sample_id, message, where, line


@dataclass
class Sample:
    id: str
    datasource: str | None
    image_paths: list[Path]
    messages: list[dict[str, Any]]   # every turn, processor chat format
    raw: dict[str, Any]
    line: int | None = None          # the line its record starts on in its file (1-based)
    where: str | None = None         # "line 7" (JSONL) or "record 3, line 1" (JSON list)

    def error(self, message: str) -> SampleError:
        """A SampleError about this sample (its id and where it is)."""
        return SampleError(self.id, message, self.where, self.line)

    @property
    def prompt_messages(self) -> list[dict[str, Any]]:
        """The turns before the last assistant answer (what the model is asked)."""
        last = self._last_answer_index()
        return self.messages if last is None else self.messages[:last]

    @property
    def prompt_text(self) -> str:
        """The text of the turns before the answer, one line per text part."""
        return "\n".join(item["text"] for m in self.prompt_messages for item in m["content"] if item["type"] == "text")

    @property
    def answer(self) -> str | None:
        """The last assistant answer (the ground truth), if any."""
        last = self._last_answer_index()
        return None if last is None else "".join(item["text"] for item in self.messages[last]["content"]
                                                 if item["type"] == "text")

    def _last_answer_index(self) -> int | None:
        return next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i]["role"] == "assistant"), None)


@dataclass(frozen=True)
class Record:
    """One record of a samples file: the JSON value on its line, or why the line is not JSON."""

    line: int                 # 1-based line where the record starts
    value: Any = None
    error: str | None = None  # set when the line does not parse
    number: int | None = None  # 1-based position in a JSON list (None in JSONL, where the line says it)

    @property
    def where(self) -> str:
        return f"line {self.line}" if self.number is None else f"record {self.number}, line {self.line}"


def read_records(path: str | Path) -> list[Record]:
    """Every record of a JSON list or JSONL file with its line; a JSONL line that is not JSON is a Record with an
    ``error``, a JSON list that does not parse a ValueError naming the file and line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    data = data.removeprefix(codecs.BOM_UTF8)
    if data.lstrip().startswith(b"["):
        try:
            return _json_list_records(path, data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc})") from exc
        except ValueError:
            if not _first_line_is_json(data):     # JSONL whose first record is an array: read as JSONL
                raise
    records = []
    for lineno, raw_line in enumerate(data.split(b"\n"), 1):     # JSONL: records end at \n only
        if not raw_line.strip():
            continue
        try:
            records.append(Record(lineno, json.loads(raw_line.decode("utf-8"))))
        except UnicodeDecodeError as exc:
            records.append(Record(lineno, error=f"not UTF-8 text ({exc.reason} at byte {exc.start})"))
        except json.JSONDecodeError as exc:
            records.append(Record(lineno, error=f"invalid JSON at column {exc.colno} ({exc.msg})"))
    return records


def _first_line_is_json(data: bytes) -> bool:
    first = data.lstrip().split(b"\n", 1)[0]
    try:
        json.loads(first)
    except ValueError:
        return False
    return True


def _json_list_records(path: Path, text: str) -> list[Record]:
    """The elements of a JSON list, each with the line it starts on."""
    decoder = json.JSONDecoder()
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON at line {exc.lineno} ({exc.msg}); a JSON list must parse as a "
                         "whole (in JSONL a broken line is only that record's error)") from exc
    if not isinstance(values, list):
        raise ValueError(f"{path}: expected a JSON list of records or JSONL")
    records, pos = [], text.index("[") + 1
    line, counted = 1, 0
    for _ in values:           # the same values again, element by element, for their line numbers
        while text[pos] in " \t\r\n,":
            pos += 1
        value, end = decoder.raw_decode(text, pos)
        line, counted = line + text.count("\n", counted, pos), pos
        records.append(Record(line, value, number=len(records) + 1))
        pos = end
    return records


def _sample_id(raw: dict[str, Any], index: int, where: str | None, line: int | None) -> str:
    """The record's id ("#N", its 1-based position, when it has none); SampleError for a bad one."""
    if "id" not in raw:
        return f"#{index + 1}"
    value = raw["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise SampleError(f"#{index + 1}", f"'id' must be a non-empty string or an integer, got {_short(value)}",
                          where, line)
    return str(value)


def outside_root(path: str, allow_absolute_paths: bool = ALLOW_ABSOLUTE_IMAGE_PATHS) -> bool:
    """Whether an image path would be read from outside its data root (from the text alone: no disk access)."""
    if os.path.isabs(path):
        return not allow_absolute_paths
    return os.path.normpath(path).split(os.sep)[0] == os.pardir


def parse_sample(raw: dict[str, Any], data_root: str | Path = ".", index: int = 0,
                 record: Record | None = None, *, allow_absolute_paths: bool = ALLOW_ABSOLUTE_IMAGE_PATHS) -> Sample:
    """Validate one record (``record``: where it is in its file) and turn its conversation into
    processor chat messages. An image path outside the data root is an error (module docstring)."""
    where, line = (record.where, record.line) if record is not None else (None, None)
    sample_id = _sample_id(raw, index, where, line)

    def bad(message: str) -> SampleError:
        return SampleError(sample_id, message, where, line)

    images = raw.get("image", [])
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(p, str) and p for p in images):
        raise bad(f"'image' must be a path or a list of paths, got {_short(raw.get('image'))}")
    for path in images:
        if outside_root(path, allow_absolute_paths):
            raise bad(f"image path {_short(path, 300)} is outside the data root (absolute paths are read only with "
                      "--allow-absolute-image-paths / data.allow_absolute_image_paths)")
    datasource = raw.get("datasource")
    if datasource is not None and not isinstance(datasource, str):
        raise bad(f"'datasource' must be a string, got {_short(datasource)}")
    turns = raw.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise bad(f"'conversations' must be a non-empty list, got {_short(turns)}")
    messages = []
    placeholders = 0
    for t, turn in enumerate(turns):
        role = turn.get("from") if isinstance(turn, dict) else None
        if not isinstance(role, str) or role not in ROLES or not isinstance(turn.get("value"), str):
            raise bad(f"turn {t} needs 'from' in {sorted(ROLES)} and a string 'value', got {_short(turn)}")
        placeholders += turn["value"].count(IMAGE_PLACEHOLDER)
        messages.append({"role": ROLES[role], "content": chat_content(turn["value"])})
    if placeholders != len(images):
        raise bad(f"{placeholders} <image> placeholder(s) but {len(images)} image path(s)")
    root = Path(data_root)
    return Sample(id=sample_id, datasource=datasource, image_paths=[root / p for p in images],
                  messages=messages, raw=raw, line=line, where=where)


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def iter_samples(path: str | Path, data_root: str | Path = ".", *,
                 allow_absolute_paths: bool = ALLOW_ABSOLUTE_IMAGE_PATHS) -> Iterator[Sample | SampleError]:
    """Every record as a Sample, or the SampleError that says why it is unusable; every record of an id that
    appears more than once is refused, naming all its lines (predictions and reports are keyed by id)."""
    records = read_records(path)
    places: dict[str, list[str]] = defaultdict(list)     # id -> where each record of it is
    for rec in records:
        value = rec.value.get("id") if isinstance(rec.value, dict) else None
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            places[str(value)].append(rec.where)
    for i, rec in enumerate(records):
        if rec.error is not None:
            yield SampleError(f"#{i + 1}", rec.error, rec.where, rec.line)
        elif not isinstance(rec.value, dict):
            yield SampleError(f"#{i + 1}", f"a JSON {_json_type(rec.value)}, expected an object", rec.where, rec.line)
        else:
            try:
                sample = parse_sample(rec.value, data_root, i, rec, allow_absolute_paths=allow_absolute_paths)
            except SampleError as exc:
                yield exc
                continue
            if len(places[sample.id]) > 1:
                yield sample.error(f"id {sample.id!r} is not unique ({'; '.join(places[sample.id])}): every "
                                   "record of it is refused")
            else:
                yield sample


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def make_sample(sample_id: str, datasource: str, task: str, image_path: str, prompt: str, answer: str) -> dict:
    """One sample in the authors' format (one image, one question, one answer), with its ``task``."""
    return {"id": sample_id, "datasource": datasource, "task": task, "image": [image_path],
            "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]}


def planning_sample(sample_id: str, datasource: str, image_path: str, command: str, velocity, acceleration,
                    waypoints) -> dict:
    """A planning sample: the NAVSIM prompt for this telemetry, answered with ``waypoints`` [8, 2] (ego frame)."""
    return make_sample(sample_id, datasource, "plan", image_path,
                       format_planning_prompt(command, velocity, acceleration), format_waypoints(waypoints))


def dump_json_list(path: str | Path, items: list[dict]) -> None:
    """Write a JSON list with one item per line (the datasets' train.json / val.json), atomically."""
    from ..utils.atomic import atomic_write_text

    lines = [json.dumps(item, ensure_ascii=False) for item in items]
    atomic_write_text(path, "[\n" + ",\n".join(lines) + ("\n" if lines else "") + "]\n")


def load_images(sample: Sample, limits: ImageLimits = DEFAULT_LIMITS):
    """The sample's images as RGB PIL images. A SampleError names a file that is missing, does not
    decode, or is over ``limits`` (refused from its header, before its pixels are decoded)."""
    out = []
    for p in sample.image_paths:
        try:
            out.append(load_rgb(p, limits))
        except ImageError as exc:
            raise sample.error(("image refused: " if exc.code == TOO_LARGE else "cannot read image: ") + str(exc)) \
                from None
    return out
