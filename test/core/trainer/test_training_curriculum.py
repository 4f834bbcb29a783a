"""The curriculum command chains B = 4 -> 8 -> 16 -> 32, each stage starting from the previous
stage's output; the Block-32 model it produces decodes a memorised answer exactly with the
repository's decoder (the paper's default decoding: 32 steps, dynamic threshold 0.9)."""
from __future__ import annotations


import pytest
import yaml

from test.support import REPO_ROOT
from wam_diff2_core.config import read_diffusion_file
from wam_diff2_core.data.samples import iter_samples, load_images
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.model.prompt_encoding import encode_prompts
from wam_diff2_core.trainer.checkpointing import read_metrics
from wam_diff2_core.trainer.tiny_data import write_tiny_dataset

TRAINING = REPO_ROOT / "training"
STEPS_PER_STAGE = 50
LR = "2e-3"




@pytest.mark.slow
def test_curriculum_to_block32_memorises_and_decodes_exactly(tiny_checkpoint, tmp_path, capsys):
    from wam_diff2_core.cli import main

    data = write_tiny_dataset(tmp_path / "data", num_samples=2)
    out = tmp_path / "curriculum"
    args = ["train", "--config", str(TRAINING / "curriculum.yaml"), "--model.path", str(tiny_checkpoint),
            "--data.train_file", str(data), "--data.data_root", str(data.parent),
            "--data.min_pixels", "1024", "--data.max_pixels", "16384",
            "--train.global_batch_size", "2", "--train.micro_batch_size", "2",
            "--train.max_steps", str(STEPS_PER_STAGE), "--optim.lr", LR, "--optim.merger_lr", LR,
            "--optim.vision_lr", LR, "--optim.weight_decay", "0", "--output.dir", str(out),
            "--output.save_every_steps", "0"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out / 'block32' / 'final'}"

    previous = str(tiny_checkpoint)
    for block_size in (4, 8, 16, 32):
        stage = out / f"block{block_size}"
        assert read_diffusion_file(stage / "final")["block_size"] == block_size
        resolved = yaml.safe_load((stage / "config.yaml").read_text())
        assert resolved["model"]["path"] == previous               # chained, no copying
        assert resolved["diffusion"]["block_size"] == block_size
        records = read_metrics(stage)
        assert len(records) == STEPS_PER_STAGE and records[-1]["loss"] < records[0]["loss"]
        previous = str(stage / "final")

    # --resume on a finished curriculum skips every stage
    stamp = (out / "block32" / "final" / "model.safetensors").stat().st_mtime_ns
    assert main(args + ["--resume"]) == 0
    assert (out / "block32" / "final" / "model.safetensors").stat().st_mtime_ns == stamp

    loaded = load_checkpoint(out / "block32" / "final", device="cpu", dtype="float32")
    assert loaded.config.block_size == 32 and loaded.config.settings.denoising_steps == 32
    decoder = BlockDiffusionDecoder(loaded.model, loaded.config)
    for sample in iter_samples(data, data.parent):
        inputs = encode_prompts(loaded.processor, [sample.prompt_messages], [load_images(sample)])
        result = decoder.generate(inputs)
        assert result.finished[0]
        assert loaded.processor.tokenizer.decode(result.sequences[0]) == sample.answer
