"""wam_diff2_core.data.samples: every malformed record is its own SampleError naming the sample and
its line (never an error for the whole file); duplicate ids are refused, every record of them;
images over the size guard are refused from their header."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from test.support.hostile_data import huge_png, planning_record
from wam_diff2_core.data.samples import Sample, SampleError, iter_samples, load_images, read_records
from wam_diff2_core.images import ImageLimits


def _items(path, root=None):
    return list(iter_samples(path, root or path.parent))


def _errors(items):
    return {(e.sample_id, e.line): e.reason for e in items if isinstance(e, SampleError)}


def test_a_broken_jsonl_line_and_a_non_object_record_are_only_their_own_errors(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join([json.dumps(planning_record("a", [], placeholder=False)), "{broken", "",
                               "[1, 2]", '"text"', json.dumps(planning_record("b", [], placeholder=False))]) + "\n")
    items = _items(path)
    assert [s.id for s in items if isinstance(s, Sample)] == ["a", "b"]
    assert [(s.line, s.where) for s in items if isinstance(s, Sample)] == [(1, "line 1"), (6, "line 6")]
    errors = _errors(items)
    assert errors == {("#2", 2): "invalid JSON at column 2 (Expecting property name enclosed in double quotes)",
                      ("#3", 4): "a JSON array, expected an object", ("#4", 5): "a JSON string, expected an object"}
    assert str(items[1]) == "sample #2 (line 2): invalid JSON at column 2 (Expecting property name enclosed in " \
                            "double quotes)"


def test_records_of_a_json_list_are_numbered_with_their_line(tmp_path):
    path = tmp_path / "s.json"
    records = [planning_record("a", [], placeholder=False), 5, planning_record("b", [], placeholder=False)]
    path.write_text(json.dumps(records, indent=1))
    items = _items(path)
    assert str(items[1]).startswith("sample #2 (record 2, line ")
    assert items[0].line == 2 and items[1].line > items[0].line and items[2].line > items[1].line
    path.write_text(json.dumps(records))                               # all on one line: the record number says
    assert [i.where for i in _items(path)] == ["record 1, line 1", "record 2, line 1", "record 3, line 1"]
    path.write_text("[" + json.dumps(records[0]) + ",\n{broken")        # a list that does not parse: the file's error
    with pytest.raises(ValueError, match=r"s\.json: invalid JSON at line 2 .*a JSON list must parse as a whole"):
        read_records(path)
    path.write_text("[1, 2]\n" + json.dumps(records[0]) + "\n")          # JSONL whose first record is an array
    assert [(r.line, r.value) for r in read_records(path)] == [(1, [1, 2]), (2, records[0])]


@pytest.mark.parametrize("field, value, fragment", [
    ("id", {"a": 1}, "'id' must be a non-empty string or an integer"),
    ("id", True, "'id' must be a non-empty string or an integer"),
    ("id", "", "'id' must be a non-empty string or an integer"),
    ("image", 7, "'image' must be a path or a list of paths, got 7"),
    ("image", [None], "'image' must be a path or a list of paths"),
    ("datasource", ["x"], "'datasource' must be a string"),
    ("conversations", "hello", "'conversations' must be a non-empty list"),
    ("conversations", [{"from": ["human"], "value": "x"}], "turn 0 needs 'from'"),   # unhashable: was a TypeError
    ("conversations", [{"from": "human", "value": 5}], "turn 0 needs 'from'"),
    ("conversations", ["not a turn"], "turn 0 needs 'from'"),
])
def test_fields_of_the_wrong_type_are_the_records_error(tmp_path, field, value, fragment):
    path = tmp_path / "s.jsonl"
    bad = {**planning_record("bad", [], placeholder=False), field: value}
    path.write_text(json.dumps(planning_record("good", [], placeholder=False)) + "\n" + json.dumps(bad) + "\n")
    items = _items(path)
    assert isinstance(items[0], Sample)
    assert isinstance(items[1], SampleError) and items[1].line == 2 and fragment in items[1].reason
    assert str(items[1]).startswith(f"sample {'bad' if field != 'id' else '#2'} (line 2): ")


def test_an_id_used_twice_refuses_every_record_of_it_with_their_lines(tmp_path):
    path = tmp_path / "s.jsonl"
    rows = [planning_record(i, [], placeholder=False) for i in ("x", "y", "x", 7, "7")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = _items(path)
    assert [s.id for s in items if isinstance(s, Sample)] == ["y"]
    assert _errors(items) == {
        ("x", 1): "id 'x' is not unique (line 1; line 3): every record of it is refused",
        ("x", 3): "id 'x' is not unique (line 1; line 3): every record of it is refused",
        ("7", 4): "id '7' is not unique (line 4; line 5): every record of it is refused",     # 7 and "7": one id
        ("7", 5): "id '7' is not unique (line 4; line 5): every record of it is refused"}


def test_bom_and_a_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(planning_record("a", [], placeholder=False)).encode()
                     + b"\n{\"id\": \"\xff\"}\n")
    items = _items(path)
    assert isinstance(items[0], Sample) and items[0].id == "a"
    assert isinstance(items[1], SampleError) and items[1].reason.startswith("not UTF-8 text")


def test_images_over_the_guard_are_refused_naming_the_file_and_its_size(tmp_path):
    (tmp_path / "huge.png").write_bytes(huge_png())
    Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(tmp_path / "small.png")
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(planning_record("huge", ["huge.png"])) + "\n"
                    + json.dumps(planning_record("small", ["small.png"])) + "\n")
    huge, small = _items(path)
    with pytest.raises(SampleError) as info:       # PIL's DecompressionBombError escaped before
        load_images(huge)
    assert str(info.value).startswith("sample huge (line 1): image refused: too_large: ")
    assert "huge.png has 400000000 pixels, above max_decoded_pixels 50000000" in str(info.value)
    assert load_images(small)[0].size == (40, 30)
    with pytest.raises(SampleError, match=r"sample small \(line 2\): image refused: .*small\.png is 40x30 = 1200 "
                                          r"pixels, above max_decoded_pixels 1000"):
        load_images(small, ImageLimits(max_decoded_pixels=1000))


# ---------------------------------------------------------------- image paths stay inside the data root
def _png(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)
    return path


def _outside_reason(items, sample_id):
    (error,) = [e for e in items if isinstance(e, SampleError) and e.sample_id == sample_id]
    return error.reason


def test_paths_out_of_the_root_are_refused_with_one_text_whether_they_exist_or_not(tmp_path):
    root = tmp_path / "root"
    _png(root / "img" / "in.png")
    exists = _png(tmp_path / "secret.png")
    cases = {"up-exists": "../secret.png", "up-missing": "../nope.png", "deep-up": "img/../../secret.png",
             "abs-exists": str(exists), "abs-missing": str(tmp_path / "nope.png")}
    path = root / "s.jsonl"
    path.write_text("".join(json.dumps(planning_record(i, [p])) + "\n" for i, p in cases.items())
                    + json.dumps(planning_record("inside", ["img/../img/in.png"])) + "\n")
    items = list(iter_samples(path, root))
    assert [s.id for s in items if isinstance(s, Sample)] == ["inside"]
    reasons = {i: _outside_reason(items, i).replace(repr(p), "PATH") for i, p in cases.items()}
    assert len(set(reasons.values())) == 1, reasons          # no oracle: the text never says whether it exists
    assert reasons["up-exists"] == ("image path PATH is outside the data root (absolute paths are read only with "
                                    "--allow-absolute-image-paths / data.allow_absolute_image_paths)")


def test_the_flag_lets_absolute_paths_through_and_never_dot_dot(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    absolute = _png(tmp_path / "elsewhere" / "a.png")
    path = root / "s.jsonl"
    path.write_text(json.dumps(planning_record("abs", [str(absolute)])) + "\n"
                    + json.dumps(planning_record("up", ["../elsewhere/a.png"])) + "\n")
    items = list(iter_samples(path, root, allow_absolute_paths=True))
    (sample,) = [s for s in items if isinstance(s, Sample)]
    assert sample.id == "abs" and load_images(sample)[0].size == (8, 8)
    assert "outside the data root" in _outside_reason(items, "up")


def test_a_symlink_under_the_root_is_followed(tmp_path):
    """Decided: the check is on the path as written; the data root's own links (image folders on
    another disk) are the root owner's choice, and a samples file cannot create one."""
    root = tmp_path / "root"
    root.mkdir()
    _png(tmp_path / "disk" / "a.png")
    (root / "images").symlink_to(tmp_path / "disk")
    path = root / "s.jsonl"
    path.write_text(json.dumps(planning_record("linked", ["images/a.png"])) + "\n")
    (sample,) = list(iter_samples(path, root))
    assert load_images(sample)[0].size == (8, 8)


def test_every_entry_point_that_reads_samples_has_the_flag():
    import argparse
    from wam_diff2_core.cli import bench, infer, val_loss
    from wam_diff2_core.data.samples import ALLOW_ABSOLUTE_IMAGE_PATHS
    from wam_diff2_core.trainer.training_config import TrainingConfig, load_training_config
    for module in (infer, val_loss, bench):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        assert parser.get_default("allow_absolute_image_paths") is ALLOW_ABSOLUTE_IMAGE_PATHS, module.__name__
        assert "--allow-absolute-image-paths" in parser._option_string_actions, module.__name__
    assert TrainingConfig().data.allow_absolute_image_paths is ALLOW_ABSOLUTE_IMAGE_PATHS
    cfg = load_training_config(None, ["--data.allow_absolute_image_paths", "true"])
    assert cfg.data.allow_absolute_image_paths is True
