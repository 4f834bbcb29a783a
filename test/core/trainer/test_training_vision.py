"""recipe: vision, the vision tower's warm-up: per-cell targets from grounding answers, a run that learns on
grounding samples alone, changes the tower and nothing else, and resumes with its head."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from test.support import REPO_ROOT
from wam_diff2_core.config import ConfigError
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from wam_diff2_core.trainer.checkpointing import read_metrics
from wam_diff2_core.trainer.recipes import run_stage
from wam_diff2_core.trainer.recipes.vision import BOX_SCALE, HEAD_FILE, cell_targets
from wam_diff2_core.trainer.tiny_data import write_tiny_dataset
from wam_diff2_core.trainer.training_config import load_training_config

STEPS = 10


def config(model, data_file, out_dir, **extra):
    values = {"model.path": str(model), "data.train_file": str(data_file), "data.data_root": str(data_file.parent),
              "data.min_pixels": TINY_MIN_PIXELS, "data.max_pixels": TINY_MAX_PIXELS, "train.max_steps": STEPS,
              "train.global_batch_size": 4, "train.micro_batch_size": 2, "optim.lr": 3e-3, "optim.merger_lr": 3e-3,
              "optim.vision_lr": 3e-3, "optim.warmup_max_steps": 0, "output.dir": str(out_dir),
              "output.save_every_steps": 0, **extra}
    return load_training_config(REPO_ROOT / "training/demo/vision.yaml", values)


def decode_cells(scores: torch.Tensor, threshold: float = 0.0) -> list[tuple[float, float, float, float, float]]:
    """The inverse of cell_targets' encoding: head outputs of one image [rows, cols, 5] -> (x1, y1, x2, y2 on
    0..1000, logit) of every cell whose objectness logit is above ``threshold``."""
    rows, cols = scores.shape[:2]
    out = []
    for r, c in (scores[..., 0] > threshold).nonzero().tolist():
        logit, dx, dy, lw, lh = scores[r, c].tolist()
        cx, cy = (c + dx) / cols * BOX_SCALE, (r + dy) / rows * BOX_SCALE
        w, h = math.exp(min(lw, 0.0)) * BOX_SCALE, math.exp(min(lh, 0.0)) * BOX_SCALE
        out.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, logit))
    return out


def test_a_box_is_the_target_of_the_cell_its_centre_lies_in_and_decodes_back():
    # 4 rows x 10 columns: a box centred at (525, 375) of 1000 is in column 5, row 1
    targets = cell_targets([(500, 300, 550, 450)], (4, 10))
    assert targets.objectness.nonzero().tolist() == [[1, 5]]
    dx, dy, lw, lh = targets.box[1, 5].tolist()
    assert (dx, dy) == pytest.approx((0.25, 0.5)) and (lw, lh) == pytest.approx((math.log(0.05), math.log(0.15)))
    scores = torch.cat([targets.objectness[..., None] * 20 - 10, targets.box], -1)
    [(x1, y1, x2, y2, logit)] = decode_cells(scores)
    assert (x1, y1, x2, y2) == pytest.approx((500, 300, 550, 450)) and logit == 10


def test_two_centres_in_one_cell_keep_the_larger_box_and_empty_boxes_are_no_target():
    small, large = (0, 0, 20, 20), (0, 0, 90, 90)
    for boxes in ([small, large], [large, small]):
        targets = cell_targets(boxes + [(300, 300, 300, 400)], (2, 2))
        assert targets.objectness.sum() == 1
        assert targets.box[0, 0, 2].item() == pytest.approx(math.log(0.09))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("data"), num_samples=12)   # 3 grounding samples


@pytest.fixture(scope="module")
def vision_run(tiny_checkpoint, data_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("vision")
    return run_stage(config(tiny_checkpoint, data_file, out)), out


def test_the_warm_up_learns_on_grounding_samples_and_changes_the_tower_only(tiny_checkpoint, vision_run):
    final, out = vision_run
    records = read_metrics(out / "metrics.jsonl")
    assert len(records) == STEPS and records[0]["epoch"] == round(4 / 3, 4)  # batches of 4 of the 3 grounding samples
    assert records[-1]["loss"] < 0.5 * records[0]["loss"]
    last = records[-1]
    assert last["objectness"] == last["ce"] and last["loss"] == pytest.approx(last["objectness"] + last["box"])
    before, after = load_file(tiny_checkpoint / "model.safetensors"), load_file(final / "model.safetensors")
    assert before.keys() == after.keys()                                          # the head is not saved
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".visual." in f".{k}" and "deepstack" not in k for k in changed)
    assert any(".merger." in k for k in changed) and any("patch_embed" in k for k in changed)


def test_a_resumed_run_takes_its_head_back_and_ends_where_an_uninterrupted_one_does(tiny_checkpoint, data_file,
                                                                                      tmp_path):
    import shutil
    cfg = config(tiny_checkpoint, data_file, tmp_path / "straight", **{"train.max_steps": 4,
                                                                       "output.save_every_steps": 2})
    run_stage(cfg)
    assert (tmp_path / "straight/checkpoints/step-000002/trainer_state" / HEAD_FILE).is_file()
    resumed = tmp_path / "resumed"                   # the same run stopped after its step-2 checkpoint
    shutil.copytree(tmp_path / "straight", resumed)
    shutil.rmtree(resumed / "final")
    run_stage(cfg.replace(**{"output.dir": str(resumed)}), resume=True)
    losses = [[r["loss"] for r in read_metrics(run / "metrics.jsonl")] for run in (tmp_path / "straight", resumed)]
    assert losses[0] == losses[1]
    a, b = (load_file(run / "final/model.safetensors") for run in (tmp_path / "straight", resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_data_without_grounding_samples_is_refused_by_name(tiny_checkpoint, tmp_path):
    planning_only = write_tiny_dataset(tmp_path / "data", num_samples=2)          # two planning samples
    with pytest.raises(ConfigError, match=r"no usable sample \(0 rejected, 2 not of the kind this recipe trains on\)"):
        run_stage(config(tiny_checkpoint, planning_only, tmp_path / "out"))


def test_a_vision_curriculum_is_refused(tiny_checkpoint, data_file, tmp_path):
    with pytest.raises(ConfigError, match="a curriculum chains finetune stages; recipe is vision"):
        config(tiny_checkpoint, data_file, tmp_path / "out", **{"curriculum.block_sizes": [4, 8]})
