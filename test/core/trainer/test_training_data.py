"""Training data: bad samples are reported by id and skipped or fatal (never trained on); the
stream order and how a global batch is split over processes and micro-batches."""
from __future__ import annotations

import json

import pytest
import torch

from wam_diff2_core.config import ConfigError
from wam_diff2_core.data.samples import SampleError
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from wam_diff2_core.trainer.training_data import BatchPlan, DataOrder, Example, SampleDataset, StepBatches, total_steps
from wam_diff2_core.trainer.tiny_data import tiny_records, write_tiny_dataset




PIXELS = {"min_pixels": TINY_MIN_PIXELS, "max_pixels": TINY_MAX_PIXELS}


def _dataset(tiny_model, path, **kw):
    return SampleDataset(path, tiny_model.processor, eos_token_id=tiny_model.config.eos_token_id,
                         data_root=path.parent, **PIXELS, **kw)


@pytest.fixture()
def messy_data(tmp_path):
    """Three good samples and one of each kind of bad one."""
    good = write_tiny_dataset(tmp_path, num_samples=3)
    records = json.loads(good.read_text())
    (tmp_path / "images" / "broken.png").write_bytes(b"not an image")
    records += [
        {"id": "no-turns", "image": [], "conversations": []},
        {"id": "missing-image", "image": ["images/nope.png"],
         "conversations": [{"from": "human", "value": "<image>\nhi"}, {"from": "gpt", "value": "1"}]},
        {"id": "placeholder-mismatch", "image": ["images/000.png"],
         "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "1"}]},
        {"id": "no-answer", "image": [], "conversations": [{"from": "human", "value": "hi"}]},
        {"id": "broken-image", "image": ["images/broken.png"],
         "conversations": [{"from": "human", "value": "<image>\nhi"}, {"from": "gpt", "value": "1"}]},
    ]
    path = tmp_path / "messy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_bad_samples_are_skipped_and_reported_by_id(tiny_model, messy_data, caplog):
    ds = _dataset(tiny_model, messy_data, on_error="skip")
    assert {e.sample_id for e in ds.rejected} == {"no-turns", "missing-image", "placeholder-mismatch"}
    assert "missing-image" in caplog.text
    items = [ds[i] for i in range(len(ds))]
    errors = {item.sample_id for item in items if isinstance(item, SampleError)}
    assert errors == {"no-answer", "broken-image"}           # found when encoding; returned, not trained on
    assert sum(isinstance(item, Example) for item in items) == 3


def test_mix_files_add_their_samples_n_times_with_images_beside_them(tiny_model, tmp_path, messy_data):
    mixed = write_tiny_dataset(tmp_path / "elsewhere" / "dagger", num_samples=2, seed=1)
    ds = _dataset(tiny_model, messy_data, mix=[(mixed, 3)])
    base = len(_dataset(tiny_model, messy_data))
    mixed_ids = [s.id for s in ds.samples[base:]]
    assert len(ds) == base + 2 * 3 and mixed_ids == mixed_ids[:2] * 3
    assert ds.samples[base].image_paths[0].parent == mixed.parent / "images"    # relative to its own file
    assert isinstance(ds[len(ds) - 1], Example)
    lonely = write_tiny_dataset(tmp_path / "lonely", num_samples=1)
    (lonely.parent / "images" / "000.png").unlink()
    with pytest.raises(ConfigError, match=r"data\.mix\[1\]: .*train\.json has no usable sample \(1 rejected\)"):
        _dataset(tiny_model, messy_data, mix=[(mixed, 1), (lonely, 1)])


def test_bad_samples_fail_fast_when_asked(tiny_model, messy_data):
    with pytest.raises(SampleError, match="no-turns"):
        _dataset(tiny_model, messy_data, on_error="fail")


def test_unreadable_image_fails_with_its_id(tiny_model, tmp_path):
    path = write_tiny_dataset(tmp_path, num_samples=2)
    (tmp_path / "images" / "001.png").write_bytes(b"garbage")
    ds = _dataset(tiny_model, path, on_error="fail")
    assert isinstance(ds[0], Example)
    with pytest.raises(SampleError, match="tiny-001.*cannot read image"):
        ds[1]


def test_too_long_samples_are_rejected(tiny_model, tmp_path):
    path = write_tiny_dataset(tmp_path, num_samples=2)
    ds = _dataset(tiny_model, path, block_size=32, max_length=40)
    item = ds[0]
    assert isinstance(item, SampleError) and "data.max_length" in str(item)


def test_a_file_without_usable_samples_is_a_config_error(tiny_model, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"id": "x", "conversations": []}]))
    with pytest.raises(ConfigError, match="no usable sample"):
        _dataset(tiny_model, path)


def test_jsonl_and_json_give_the_same_examples(tiny_model, tmp_path):
    a = _dataset(tiny_model, write_tiny_dataset(tmp_path / "a", num_samples=3))
    b = _dataset(tiny_model, write_tiny_dataset(tmp_path / "b", num_samples=3, jsonl=True))
    for i in range(3):
        assert torch.equal(a[i].prefix_ids, b[i].prefix_ids) and torch.equal(a[i].response_ids, b[i].response_ids)


def test_malformed_records_are_rejected_with_their_line_and_the_rest_is_read(tiny_model, tmp_path):
    """Before: a non-object record or a broken JSONL line aborted the run (ValueError), an
    unhashable 'from' crashed it (TypeError), and both records of a duplicate id were trained on."""
    good = json.loads(write_tiny_dataset(tmp_path, num_samples=3).read_text())
    lines = [json.dumps(good[0]), "[1, 2]", '{"id": "cut", ', json.dumps(good[1]),
             json.dumps({**good[2], "conversations": [{"from": ["human"], "value": "x"}]}),
             json.dumps({**good[2], "id": "tiny-000"})]
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    ds = _dataset(tiny_model, path, on_error="skip")
    assert [s.id for s in ds.samples] == ["tiny-001"]
    assert {(e.sample_id, e.line) for e in ds.rejected} == {("#2", 2), ("#3", 3), ("tiny-002", 5), ("tiny-000", 1),
                                                            ("tiny-000", 6)}
    assert all(str(e).startswith(f"sample {e.sample_id} (line {e.line}): ") for e in ds.rejected)
    with pytest.raises(SampleError, match=r"sample tiny-000 \(line 1\): id 'tiny-000' is not unique \(line 1; "
                                          r"line 6\)"):
        _dataset(tiny_model, path, on_error="fail")


def test_an_oversized_image_is_a_skipped_sample_not_a_crash(tiny_model, tmp_path):
    """Before: PIL's DecompressionBombError (not an OSError) escaped __getitem__ and stopped training."""
    from test.support.hostile_data import huge_png
    path = write_tiny_dataset(tmp_path, num_samples=2)
    (tmp_path / "images" / "001.png").write_bytes(huge_png())
    ds = _dataset(tiny_model, path)
    assert isinstance(ds[0], Example)
    item = ds[1]
    assert isinstance(item, SampleError) and item.sample_id == "tiny-001"
    assert "image refused: too_large: " in str(item) and "400000000 pixels" in str(item)
    from wam_diff2_core.images import ImageLimits
    small = _dataset(tiny_model, path, image_limits=ImageLimits(max_decoded_pixels=100))   # the limit is a setting
    assert "above max_decoded_pixels 100" in str(small[0])


def test_the_image_limits_default_to_the_cores(tmp_path):
    from wam_diff2_core.images import ImageLimits
    from wam_diff2_core.trainer.training_config import TrainingConfig
    data = TrainingConfig().data
    assert ImageLimits(data.max_decoded_pixels, data.max_decoded_bytes) == ImageLimits()


def test_tiny_records_mix_tasks():
    kinds = {r["datasource"] for r in tiny_records(6)}
    assert kinds == {"tiny-planning", "tiny-detection", "tiny-vqa"}


# ---------------------------------------------------------------- order and splitting
def test_each_epoch_is_a_seeded_permutation():
    order = DataOrder(7, seed=3)
    for epoch in range(3):
        assert sorted(order.index(epoch * 7 + i) for i in range(7)) == list(range(7))
    assert [order.index(i) for i in range(7)] != [order.index(7 + i) for i in range(7)]
    assert [DataOrder(7, seed=3).index(i) for i in range(14)] == [order.index(i) for i in range(14)]
    assert [DataOrder(7, seed=3, shuffle=False).index(i) for i in range(9)] == [0, 1, 2, 3, 4, 5, 6, 0, 1]


@pytest.mark.parametrize("micro,processes", [(4, 1), (2, 2), (1, 4), (1, 1), (2, 1)])
def test_a_step_sees_the_same_samples_however_it_is_split(micro, processes):
    global_batch = 4
    positions = []
    for rank in range(processes):
        plan = BatchPlan(global_batch, micro, processes, rank)
        positions += [p for batch in StepBatches(plan, start_step=2, total_steps=3) for p in batch]
    assert sorted(positions) == list(range(8, 12))


def test_batch_split_must_divide():
    with pytest.raises(ConfigError, match="global_batch_size"):
        BatchPlan(6, 4, 1, 0)
    with pytest.raises(ConfigError, match="processes"):
        BatchPlan(4, 1, 3, 0)


def test_total_steps():
    assert total_steps(10, 5, 4) == 13            # ceil(50 / 4): the stream runs across epochs
    assert total_steps(10, 5, 4, max_steps=3) == 3
