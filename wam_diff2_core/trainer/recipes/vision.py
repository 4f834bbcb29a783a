"""Vision warm-up recipe: the vision tower learns where the objects are before the language model reads it
(why: training/README.md, A vision tower built from code).

    wam-diff2 train --config training/demo/vision.yaml --model.path runs/demo/init

The tower, patch embedding through the merger, trains with a dense head on the merged visual tokens, as a
one-stage detector (YOLO / CenterNet) does: for each cell of the token grid, whether a labelled box's centre
lies in it (logistic loss, positives weighted :data:`POSITIVE_WEIGHT`), and for those cells that box (centre
offset within the cell, log width and height of the image; smooth L1). Where two centres share a cell the
larger box is the target. Only grounding samples are used (their ``bbox_2d`` answers are the labels); the
language model and the DeepStack mergers are frozen. The head is training-only: ``final/`` is the model with
its tower trained and nothing else changed; a resumable checkpoint keeps the head in its trainer state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ...outputs.parsing import BOX_SCALE, parse_boxes
from ...outputs.prompts import is_grounding_prompt
from ..training_data import Example
from .finetune import FinetuneRecipe

POSITIVE_WEIGHT = 5.0          # a cell holding a box centre, against the many that hold none
HEAD_FILE = "vision_head.safetensors"   # in a resumable checkpoint's trainer state


@dataclass
class CellTargets:
    """Per-cell targets of one image: objectness [h, w] and box [h, w, 4] (dx, dy, log w, log h)."""

    objectness: torch.Tensor
    box: torch.Tensor


def cell_targets(boxes: Sequence[Sequence[float]], grid: tuple[int, int]) -> CellTargets:
    """Targets on a ``grid`` (rows, columns) of cells from ``boxes`` (x1, y1, x2, y2 on 0..1000)."""
    rows, cols = grid
    objectness, box = torch.zeros(rows, cols), torch.zeros(rows, cols, 4)
    area = torch.zeros(rows, cols)
    for x1, y1, x2, y2 in boxes:
        w, h = (x2 - x1) / BOX_SCALE, (y2 - y1) / BOX_SCALE
        if w <= 0 or h <= 0:
            continue
        cx, cy = (x1 + x2) / 2 / BOX_SCALE * cols, (y1 + y2) / 2 / BOX_SCALE * rows
        c, r = min(max(int(cx), 0), cols - 1), min(max(int(cy), 0), rows - 1)
        if objectness[r, c] and area[r, c] >= w * h:
            continue
        objectness[r, c], area[r, c] = 1.0, w * h
        box[r, c] = torch.tensor([cx - c, cy - r, math.log(w), math.log(h)])
    return CellTargets(objectness, box)


@dataclass
class VisionBatch:
    pixel_values: torch.Tensor          # every image's patches, concatenated
    image_grid_thw: torch.Tensor        # [images, 3]
    objectness: torch.Tensor            # [cells of every image]
    box: torch.Tensor                   # [cells, 4]

    def to(self, device) -> "VisionBatch":
        return VisionBatch(**{name: t.to(device) for name, t in vars(self).items()})

    @property
    def num_targets(self) -> int:
        return int(self.objectness.sum())

    @property
    def num_tokens(self) -> int:
        return int(self.objectness.numel())


class VisionObjective(torch.nn.Module):
    """The model's vision tower, the dense head and the loss in one forward (what Accelerate wraps).
    ``total`` is the sum over images of (objectness loss + box loss); ``ce`` / ``kd`` carry the two parts."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        width = model.model.visual.config.out_hidden_size
        self.head = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 5))

    def forward(self, pixel_values, image_grid_thw, objectness, box) -> dict[str, torch.Tensor]:
        visual = self.model.model.visual
        out = visual(pixel_values.to(self.model.dtype), grid_thw=image_grid_thw)
        tokens = out.pooler_output if getattr(out, "pooler_output", None) is not None else out[0]
        scores = self.head(tokens.float())        # [cells of every image, 5]: objectness logit, dx, dy, log w, log h
        cells = (image_grid_thw.prod(-1) // visual.spatial_merge_size**2).tolist()
        weight = torch.tensor(POSITIVE_WEIGHT, device=scores.device)
        obj_sum = box_sum = scores.new_zeros(())
        for s, o, b in zip(scores.split(cells), objectness.split(cells), box.split(cells)):
            obj_sum = obj_sum + F.binary_cross_entropy_with_logits(s[:, 0], o, pos_weight=weight)
            if o.any():
                box_sum = box_sum + F.smooth_l1_loss(s[o.bool(), 1:], b[o.bool()])
        return {"total": obj_sum + box_sum, "ce": obj_sum.detach(), "kd": box_sum.detach(),
                "overlap": scores.new_zeros(())}


class VisionRecipe(FinetuneRecipe):
    """Dense-head training of the vision tower on the grounding samples (see the module docstring)."""

    def keep_sample(self, sample) -> bool:
        return is_grounding_prompt(sample.prompt_text)

    def build_objective(self) -> torch.nn.Module:
        for name, param in self.hf_model.named_parameters():
            param.requires_grad_(".visual." in f".{name}" and "deepstack_merger_list" not in name)
        return VisionObjective(self.hf_model)

    def make_batch(self, examples: Sequence[Example], noise_round: int = 0) -> VisionBatch:
        merge = self.hf_model.model.visual.spatial_merge_size
        objectness, box = [], []
        for example in examples:
            _, rows, cols = (int(v) for v in example.image_grid_thw[0])
            answer = self.processor.tokenizer.decode(example.response_ids, skip_special_tokens=True)
            parsed = parse_boxes(answer, (BOX_SCALE, BOX_SCALE))
            targets = cell_targets([(b.x_min, b.y_min, b.x_max, b.y_max) for b in parsed.boxes],
                                   (rows // merge, cols // merge))
            objectness.append(targets.objectness.flatten())
            box.append(targets.box.flatten(0, 1))
        return VisionBatch(torch.cat([e.pixel_values for e in examples]),
                           torch.cat([e.image_grid_thw for e in examples]), torch.cat(objectness), torch.cat(box))

    def loss_inputs(self, batch: VisionBatch) -> dict[str, Any]:
        return dict(vars(batch))          # VisionObjective.forward's arguments

    def extra_metrics(self, result) -> dict[str, Any]:
        return {"objectness": result.ce, "box": result.kd}

    def save_extra_state(self, trainer_state: Path) -> None:
        from safetensors.torch import save_file
        if self.accelerator.is_main_process:
            head = self.accelerator.unwrap_model(self.module).head
            save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, trainer_state / HEAD_FILE)

    def load_extra_state(self, trainer_state: Path) -> None:
        from safetensors.torch import load_file
        state = load_file(trainer_state / HEAD_FILE, device=str(self.accelerator.device))
        self.accelerator.unwrap_model(self.module).head.load_state_dict(state)

