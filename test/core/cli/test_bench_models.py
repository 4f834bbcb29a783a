"""``wam-diff2 bench --model CKPT --data SAMPLES.json``: AR vs block diffusion on planning samples."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from wam_diff2_core.benchmark import model_comparison
from wam_diff2_core.cli import main
from wam_diff2_core.outputs.prompts import format_planning_prompt


def _answer(points) -> str:
    return ",".join(f"{v:.2f}" for p in points for v in p)


# Ground truths: straight ahead 1 m per waypoint, and 2 m per waypoint.
TRUTHS = [[(k, 0.0) for k in range(1, 9)], [(2 * k, 0.0) for k in range(1, 9)]]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two planning samples, one with a non-planning answer (skipped), one malformed record."""
    root = tmp_path_factory.mktemp("bench_data")
    records = []
    for i, truth in enumerate(TRUTHS):
        rng = np.random.default_rng(i)
        Image.fromarray((rng.random((48, 64, 3)) * 255).astype(np.uint8)).save(root / f"{i}.png")
        records.append({"id": f"s{i}", "image": [f"{i}.png"], "conversations": [
            {"from": "human", "value": format_planning_prompt("straight", (4.0 + i, 0.0), (0.0, 0.0))},
            {"from": "gpt", "value": _answer(truth)}]})
    records.append({"id": "qa", "image": [], "conversations": [
        {"from": "human", "value": "what colour?"}, {"from": "gpt", "value": "red"}]})
    records.append({"id": "malformed", "conversations": []})
    (root / "samples.json").write_text(json.dumps(records))
    (root / "qa.json").write_text(json.dumps(records[2:]))
    return root


def _bench(ckpt, data, out, *extra):
    return main(["bench", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--device", "cpu",
                 "--dtype", "float32", "--block-sizes", "4", "32", "--thresholds", "0.8", "0.9",
                 "--max-new-tokens", "8", *extra])


def test_bench_models_stubbed_answers_pin_the_l2_math(tiny_checkpoint, dataset, tmp_path, monkeypatch, capsys):
    """AR answers 1 m left of the truth at every waypoint (errors 1); Block-32 t=0.9 answers 3 m ahead and
    4 m left of the truth's 4th waypoint onwards (errors 0,0,0,5,...,5 on sample 0; the exact truth on
    sample 1); every other configuration answers the random model's text (never parses)."""
    real = model_comparison.decode_one
    calls = {"n": 0}

    def stub(decoder, tokenizer, inputs, settings, generator, stages):
        text, stats, confidence = real(decoder, tokenizer, inputs, settings, generator, stages)
        calls["n"] += 1
        truth = TRUTHS[0] if inputs["input_ids"].equal(stub.first_ids) else TRUTHS[1]
        calls.setdefault("order", []).append((settings.block_size, settings.confidence_threshold, truth is TRUTHS[0]))
        if settings.block_size == 1:
            return _answer([(x, y + 1.0) for x, y in truth]), stats, None
        if settings.block_size == 32 and settings.confidence_threshold == 0.9:
            if truth is TRUTHS[1]:
                return _answer(truth), stats, None
            return _answer([(x + 3.0, y + 4.0) if k >= 3 else (x, y) for k, (x, y) in enumerate(truth)]), stats, None
        return text, stats, confidence

    from wam_diff2_core.data.samples import iter_samples, load_images
    from wam_diff2_core.model.checkpoint import load_checkpoint
    from wam_diff2_core.model.prompt_encoding import encode_prompts
    first = next(iter_samples(dataset / "samples.json", dataset))
    proc = load_checkpoint(tiny_checkpoint, device="cpu", dtype="float32").processor
    stub.first_ids = encode_prompts(proc, [first.prompt_messages], [load_images(first)])["input_ids"]
    monkeypatch.setattr(model_comparison, "decode_one", stub)

    out = tmp_path / "bench"
    assert _bench(tiny_checkpoint, dataset / "samples.json", out) == 0
    table = capsys.readouterr().out
    result = json.loads((out / "bench.json").read_text())
    assert (out / "bench.png").stat().st_size > 1000
    labels = [c["label"] for c in result["configurations"]]
    assert labels == ["AR", "Block-4 t=0.9", "Block-32 t=0.9", "Block-32 t=0.8"]
    for label in labels:
        assert label in table
    assert "prefill excluded" in table and "L2@4s med" in table
    assert result["samples"] == 2 and {s["id"] for s in result["skipped"]} == {"qa", "malformed"}
    assert calls["n"] == 4 * 3   # per configuration: one warm-up + two samples
    # the warm-ups (sample 0), then sample 0 under every configuration, then sample 1: a change in the
    # machine's load reaches every configuration alike
    configs = [(1, 0.9), (4, 0.9), (32, 0.9), (32, 0.8)]
    assert [(b, t) for b, t, _ in calls["order"]] == configs * 3
    assert [first for _, _, first in calls["order"]] == [True] * 8 + [False] * 4

    ar, b4, b32, b32_08 = result["configurations"]
    assert ar["block_size"] == 1 and ar["confidence_threshold"] is None
    assert ar["parsed"] == 2 and ar["parse_failures"] == 0
    assert ar["l2_4s_median"] == pytest.approx(1.0) and ar["l2_4s_mean"] == pytest.approx(1.0)
    assert ar["per_waypoint"] == pytest.approx([1.0] * 8)
    assert b32["parsed"] == 2 and b32["parse_failures"] == 0
    assert b32["l2_4s_median"] == pytest.approx(2.5) and b32["l2_4s_mean"] == pytest.approx(2.5)
    assert b32["per_waypoint"] == pytest.approx([0, 0, 0, 2.5, 2.5, 2.5, 2.5, 2.5])
    assert b32["per_sample"][0]["errors"] == pytest.approx([0, 0, 0, 5, 5, 5, 5, 5])
    for c in (b4, b32_08):   # the random model's answers
        assert c["parsed"] == 0 and c["parse_failures"] == 2
        assert c["l2_4s_median"] is None and c["per_waypoint"] == [None] * 8
    for c in result["configurations"]:
        assert c["samples"] == 2 and c["forwards_per_answer"] >= 1 and c["tokens_per_answer"] >= 1
        assert c["tokens_per_forward"] > 0 and c["ms_per_token"] > 0 and c["tokens_per_s"] > 0
        assert c["total_ms"] >= c["decode_ms"] > 0
        rows = c["per_sample"]
        assert c["forwards_per_answer"] == pytest.approx(np.median([r["forwards"] for r in rows]))
        assert c["ms_per_token"] == pytest.approx(np.median([r["decode_ms"] / r["tokens"] for r in rows]))
        assert c["tokens_per_forward"] == pytest.approx(np.median([r["tokens"] / r["forwards"] for r in rows]))
    # AR: the prefill's logits give the first token, then one forward per token
    assert all(r["forwards"] == r["tokens"] - 1 for r in ar["per_sample"])
    assert ar["forwards_per_token"] == pytest.approx(np.median([(r["tokens"] - 1) / r["tokens"] for r in ar["per_sample"]]))
    # constant velocity from the prompts (4 and 5 m/s, truths 2 and 4 m/s): errors k and 0.5 k at waypoint k
    cv = result["baseline"]
    assert cv["samples"] == 2 and cv["l2_4s_mean"] == pytest.approx(6.0) and cv["l2_4s_median"] == pytest.approx(6.0)
    assert cv["per_waypoint"] == pytest.approx([0.75 * k for k in range(1, 9)])
    assert ar["l2_4s_vs_cv"] == pytest.approx(1 / 6) and ar["l2_4s_vs_ar"] == pytest.approx(1.0)
    assert b32["l2_4s_vs_ar"] == pytest.approx(2.5) and b32["l2_4s_vs_cv"] == pytest.approx(2.5 / 6)
    assert b4["l2_4s_vs_ar"] is None and ar["speedup_vs_ar"] == pytest.approx(1.0)
    assert b32["speedup_vs_ar"] == pytest.approx(ar["ms_per_token"] / b32["ms_per_token"])
    assert "constant-velocity baseline (2 samples)" in table and "x AR speed" in table
    # existing --out is refused without --overwrite
    assert _bench(tiny_checkpoint, dataset / "samples.json", out) == 2


def test_bench_models_real_tiny_model(tiny_checkpoint, dataset, tmp_path, capsys):
    """The random tiny model end to end: nothing parses, the structure is still complete."""
    out = tmp_path / "b"
    assert main(["bench", "--model", str(tiny_checkpoint), "--data", str(dataset / "samples.json"), "--out",
                 str(out), "--device", "cpu", "--block-sizes", "8", "--thresholds", "0.9", "--limit", "1",
                 "--max-new-tokens", "8"]) == 0
    result = json.loads((out / "bench.json").read_text())
    assert [c["label"] for c in result["configurations"]] == ["AR", "Block-8 t=0.9", "Block-32 t=0.9"]
    assert result["samples"] == 1 and all(c["parse_failures"] == 1 for c in result["configurations"])
    assert (out / "bench.png").exists()
    for c in result["configurations"]:      # per-stage times: every stage of the image -> answer path
        ms = c["stages"]["ms"]
        assert min(ms[s]["p50"] for s in ("image", "processor", "vision", "prefill", "denoise", "parse")) > 0
        assert c["stages"]["peak_memory_mb"] > 50
    printed = capsys.readouterr().out
    assert "per stage, p50 / p95 ms" in printed and "vision encoder" in printed


def test_bench_models_an_ar_checkpoint_alone_gets_the_ar_row(tiny_ar_checkpoint, dataset, tmp_path, caplog):
    """An AR checkpoint (no mask token) as --model: the block-diffusion rows are left out with a warning,
    not an error, so an AR model can be scored on its own."""
    out = tmp_path / "ar"
    assert main(["bench", "--model", str(tiny_ar_checkpoint), "--data", str(dataset / "samples.json"), "--out",
                 str(out), "--device", "cpu", "--block-sizes", "8", "--thresholds", "0.9", "--limit", "1",
                 "--max-new-tokens", "8"]) == 0
    result = json.loads((out / "bench.json").read_text())
    assert [c["label"] for c in result["configurations"]] == ["AR"]
    assert "is autoregressive (no mask token): its block-diffusion rows are left out" in caplog.text


def test_bench_models_bad_inputs(tiny_checkpoint, dataset, tmp_path, capsys):
    assert _bench(tiny_checkpoint, tmp_path / "nope.json", tmp_path / "o1") == 2
    assert "no such file" in capsys.readouterr().err
    assert _bench(tiny_checkpoint, dataset / "qa.json", tmp_path / "o2") == 2
    assert "no planning samples" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_every_and_limit_pick_spread_samples(dataset):
    picked, grounding, skipped = model_comparison.bench_samples(str(dataset / "samples.json"), None, None, every=2)
    assert [s.id for s, _ in picked] == ["s0"] and grounding == [] and len(skipped) == 2
    picked, _, _ = model_comparison.bench_samples(str(dataset / "samples.json"), None, 1)
    assert [s.id for s, _ in picked] == ["s0"]
    from wam_diff2_core.config import ConfigError
    with pytest.raises(ConfigError, match="--every"):
        model_comparison.bench_samples(str(dataset / "samples.json"), None, None, every=0)


def test_bench_models_prints_the_pdm_score_on_a_demo_world_data_set(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """A one-frame ``synth`` data set: AR answers the expert's own plan (the reference: PDMS 1, every
    sub-score 1), Block-32 t=0.9 that plan swerving 8 m to the right (off the road: DAC 0, PDMS 0), the
    other rows the random model's text (never parses: PDMS 0, no sub-scores)."""
    from wam_diff2_core.outputs.parsing import parse_waypoints
    from wam_diff2_core.sim.dataset_export import ExportSettings, export
    from wam_diff2_core.sim.episode import EpisodeSettings

    data = tmp_path / "synth"
    export(data, ExportSettings(episodes=1, seed=0, episode=EpisodeSettings(frames=1), formats=("json",),
                                detection=False, vqa_per_frame=0), progress=False)
    samples = json.loads((data / "train.json").read_text())
    assert [s["id"] for s in samples] == ["synth0-e0000-f00000-plan"]
    expert = parse_waypoints(samples[0]["conversations"][1]["value"]).waypoints
    swerve = expert + np.stack([np.zeros(8), -8.0 * np.minimum(np.arange(1, 9) / 3.0, 1.0)], axis=1)
    real = model_comparison.decode_one

    def stub(decoder, tokenizer, inputs, settings, generator, stages):
        text, stats, confidence = real(decoder, tokenizer, inputs, settings, generator, stages)
        if settings.block_size == 1:
            return _answer(expert), stats, None
        if settings.block_size == 32 and settings.confidence_threshold == 0.9:
            return _answer(swerve), stats, None
        return text, stats, confidence

    monkeypatch.setattr(model_comparison, "decode_one", stub)
    out = tmp_path / "bench"
    assert _bench(tiny_checkpoint, data / "train.json", out) == 0
    table = capsys.readouterr().out
    result = json.loads((out / "bench.json").read_text())
    ar, b4, b32, b32_08 = result["configurations"]
    assert ar["pdm_samples"] == 1 and ar["pdms"] == pytest.approx(1.0, abs=1e-3)   # the answer's 2 decimals
    assert (ar["nc"], ar["dac"], ar["ttc"], ar["c"]) == (1.0, 1.0, 1.0, 1.0) and ar["ep"] == pytest.approx(1.0, abs=1e-3)
    assert (b32["pdms"], b32["dac"], b32["nc"]) == (0.0, 0.0, 1.0)
    for c in (b4, b32_08):
        assert c["pdm_samples"] == 1 and c["pdms"] == 0.0 and c["nc"] is None
    assert result["baseline"]["pdm_samples"] == 1 and 0.0 <= result["baseline"]["pdms"] <= 1.0
    assert "PDM score (NAVSIM v1" in table and "CV baseline" in table


def test_bench_compares_pdms_with_and_without_candidate_selection(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """``--candidates 3`` on a one-frame ``synth`` data set: the real N-row decode runs (one shared prefill),
    then its answers are replaced by known plans: row 1 swerves 8 m off the road, row 2 does not parse, row 3
    is the expert's plan. The online scene (route corridor, traffic at constant velocity) keeps row 3, and
    the data set's PDM score rates it 1 against row 1's 0: paired, on the same sample."""
    from wam_diff2_core.cli import bench_candidates
    from wam_diff2_core.outputs.parsing import parse_waypoints
    from wam_diff2_core.sim.dataset_export import ExportSettings, export
    from wam_diff2_core.sim.episode import EpisodeSettings

    data = tmp_path / "synth"
    export(data, ExportSettings(episodes=1, seed=0, episode=EpisodeSettings(frames=1), formats=("json",),
                                detection=False, vqa_per_frame=0), progress=False)
    samples = json.loads((data / "train.json").read_text())
    expert = parse_waypoints(samples[0]["conversations"][1]["value"]).waypoints
    swerve = expert + np.stack([np.zeros(8), -8.0 * np.minimum(np.arange(1, 9) / 3.0, 1.0)], axis=1)
    real = bench_candidates.decode_candidates
    seen = []

    def stub(decoder, tokenizer, inputs, settings, candidates):
        seen.append((len(real(decoder, tokenizer, inputs, settings, candidates)), candidates, settings.block_size))
        return [swerve, None, expert]

    monkeypatch.setattr(bench_candidates, "decode_candidates", stub)
    out = tmp_path / "bench"
    assert _bench(tiny_checkpoint, data / "train.json", out, "--candidates", "3", "--candidate-top-p", "0.9") == 0
    table = capsys.readouterr().out
    selection = json.loads((out / "bench.json").read_text())["selection"]
    assert [(n, c.count, c.top_p, c.temperature) for n, c, _ in seen] == [(3, 3, 0.9, 1.0)]
    assert seen[0][2] == 32                                        # the diffusion model's own settings
    assert selection["samples"] == 1 and selection["per_sample"][0]["selected"] == 3
    assert selection["per_sample"][0]["valid"] == 2 and selection["changed"] == 1
    assert selection["pdms_without"] == 0.0 and selection["pdms_with"] == pytest.approx(1.0, abs=1e-3)
    assert selection["difference_interval"] == pytest.approx([selection["difference"]] * 2)
    assert "candidate selection" in table and "PDMS without selection (row 1) 0.000, with selection" in table
    # the comparison needs a demo-world data set, and candidate settings in range
    assert _bench(tiny_checkpoint, data / "train.json", tmp_path / "o1", "--candidates", "17") == 2
    assert "candidates: must be an integer from 1 to 16" in capsys.readouterr().err
    assert _bench(tiny_checkpoint, data / "train.json", tmp_path / "o2", "--candidates", "2",
                  "--candidate-temperature", "0") == 2
    assert "candidate temperature: must be > 0" in capsys.readouterr().err


def test_bench_candidates_need_a_demo_world_data_set(tiny_checkpoint, dataset, tmp_path, capsys):
    assert _bench(tiny_checkpoint, dataset / "samples.json", tmp_path / "o", "--candidates", "2") == 2
    assert "needs planning samples of a demo-world data set" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------ grounding samples
GROUNDING = {   # Qwen3-VL grounding answers (0..1000) on 64 x 48 images
    "g0": [{"bbox_2d": [100, 100, 500, 600], "label": "car"}],
    "g1": [{"bbox_2d": [500, 200, 900, 800], "label": "car"}, {"bbox_2d": [0, 0, 250, 500], "label": "truck"}],
}


@pytest.fixture(scope="module")
def grounding_dataset(tmp_path_factory):
    """One planning sample, two grounding samples (synth's detection prompt) and a question (skipped)."""
    from wam_diff2_core.outputs.prompts import format_detection_prompt

    root = tmp_path_factory.mktemp("bench_grounding")
    records = []
    for i, sample_id in enumerate(["p0", *GROUNDING]):
        rng = np.random.default_rng(10 + i)
        Image.fromarray((rng.random((48, 64, 3)) * 255).astype(np.uint8)).save(root / f"{sample_id}.png")
        if sample_id == "p0":
            prompt, answer = format_planning_prompt("straight", (4.0, 0.0), (0.0, 0.0)), _answer(TRUTHS[0])
        else:
            prompt, answer = format_detection_prompt(), json.dumps(GROUNDING[sample_id])
        records.append({"id": sample_id, "image": [f"{sample_id}.png"], "conversations": [
            {"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]})
    records.append({"id": "qa", "image": [], "conversations": [
        {"from": "human", "value": "what colour?"}, {"from": "gpt", "value": "red"}]})
    (root / "samples.json").write_text(json.dumps(records))
    return root


def test_bench_samples_sorts_planning_from_grounding(grounding_dataset):
    path = str(grounding_dataset / "samples.json")
    planning, grounding, skipped = model_comparison.bench_samples(path, None, None)
    assert [s.id for s, _ in planning] == ["p0"] and [s.id for s in grounding] == ["g0", "g1"]
    assert [s["id"] for s in skipped] == ["qa"] and "asks for no bbox_2d boxes" in skipped[0]["reason"]
    planning, grounding, _ = model_comparison.bench_samples(path, None, 1, tasks=("grounding",))
    assert planning == [] and [s.id for s in grounding] == ["g0"]
    from wam_diff2_core.config import ConfigError
    with pytest.raises(ConfigError, match="no planning samples"):
        model_comparison.bench_samples(str(grounding_dataset / "samples.json"), None, 0, tasks=("planning",))


def test_bench_scores_grounding_answers_with_coco_ap(tiny_checkpoint, grounding_dataset, tmp_path, monkeypatch,
                                                     capsys):
    """Stubbed answers pin the AP wiring: AR answers every grounding sample's own ground truth (AP 1 on every
    metric); Block-32 answers g0's and prose for g1 (a parse failure: g1's car and truck are missed, so the car
    is recalled 1 of 2, AP 51/101 over COCO's 101 recall points, and the truck 0 of 1)."""
    from wam_diff2_core.data.samples import iter_samples, load_images
    from wam_diff2_core.model.checkpoint import load_checkpoint
    from wam_diff2_core.model.prompt_encoding import encode_prompts

    processor = load_checkpoint(tiny_checkpoint, device="cpu", dtype="float32").processor
    truth_by_prompt = []
    for sample in iter_samples(grounding_dataset / "samples.json", grounding_dataset):
        if sample.id in GROUNDING:
            # the two prompts are the same text: the images tell them apart
            pixels = encode_prompts(processor, [sample.prompt_messages], [load_images(sample)])["pixel_values"]
            truth_by_prompt.append((pixels, sample.id))
    real = model_comparison.decode_one

    def stub(decoder, tokenizer, inputs, settings, generator, stages):
        text, stats, confidence = real(decoder, tokenizer, inputs, settings, generator, stages)
        sample_id = next((i for pixels, i in truth_by_prompt if inputs["pixel_values"].equal(pixels)), None)
        if sample_id is None:
            return text, stats, confidence              # the planning sample: the random model's text
        if settings.block_size == 1 or sample_id == "g0":
            return json.dumps(GROUNDING[sample_id]), stats, None
        return "I see a car and a truck.", stats, None

    monkeypatch.setattr(model_comparison, "decode_one", stub)
    out = tmp_path / "bench"
    assert _bench(tiny_checkpoint, grounding_dataset / "samples.json", out, "--block-sizes", "32",
                  "--thresholds", "0.9") == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "bench.json").read_text())
    assert (result["samples"], result["grounding_samples"]) == (1, 2)
    ar, b32 = result["configurations"]
    assert [ar["label"], b32["label"]] == ["AR", "Block-32 t=0.9"]
    assert ar["samples"] == 1 and ar["grounding"]["samples"] == 2       # planning and grounding apart
    coco = ar["grounding"]["coco"]
    assert coco["library"].startswith("pycocotools ") and ar["grounding"]["parse_failures"] == 0
    for name in ("ap", "ap50", "ap75", "ar1", "ar10", "ar100"):
        assert coco[name] == pytest.approx(1.0, abs=1e-12)
    assert (coco["truth_boxes"], coco["predicted_boxes"]) == (3, 3)
    # the answers are mapped onto the 64 x 48 pixels of the sample's image
    g0 = ar["grounding"]["per_sample"][0]
    assert g0["id"] == "g0" and g0["boxes"] == [pytest.approx(
        {"label": "car", "score": 1.0, "x_min": 6.4, "y_min": 4.8, "x_max": 32.0, "y_max": 28.8})]
    coco = b32["grounding"]["coco"]
    assert b32["grounding"]["parse_failures"] == 1 and coco["parse_failures"] == 1
    assert b32["grounding"]["per_sample"][1]["parse_error"].startswith("invalid_json")
    assert coco["per_class"]["car"]["ap"] == pytest.approx(51 / 101, abs=1e-12)
    assert coco["per_class"]["truck"]["ap"] == 0.0
    assert coco["ap"] == pytest.approx(51 / 202, abs=1e-12) and coco["ar100"] == pytest.approx(0.25)
    assert b32["grounding"]["tokens_per_forward"] > 0 and b32["grounding"]["ms_per_token"] > 0
    assert "grounding answers: COCO AP by pycocotools" in printed and "AP@[.5:.95] per class" in printed
    assert "AR@100" in printed and "L2@4s med" in printed


def test_bench_reports_ap_on_a_synth_data_set(tiny_checkpoint, tmp_path, capsys):
    """``synth``'s detection samples with the random tiny model: the AP block is there, nothing parses, every
    unparsed answer is counted and AP is 0 against the frames' boxes (undefined when they have none)."""
    from wam_diff2_core.sim.dataset_export import ExportSettings, export
    from wam_diff2_core.sim.episode import EpisodeSettings

    data = tmp_path / "synth"
    export(data, ExportSettings(episodes=1, seed=0, episode=EpisodeSettings(frames=2), formats=("json",),
                                vqa_per_frame=0), progress=False)
    records = json.loads((data / "train.json").read_text())
    detect = [r for r in records if r["task"] == "detect"]
    assert len(detect) == 2 and len(records) == 4
    truth_boxes = sum(len(json.loads(r["conversations"][1]["value"])) for r in detect)
    out = tmp_path / "bench"
    assert main(["bench", "--model", str(tiny_checkpoint), "--data", str(data / "train.json"), "--out", str(out),
                 "--device", "cpu", "--block-sizes", "32", "--thresholds", "0.9", "--max-new-tokens", "8"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "bench.json").read_text())
    assert (result["samples"], result["grounding_samples"]) == (2, 2)
    for c in result["configurations"]:
        g = c["grounding"]
        assert g["samples"] == 2 and g["parse_failures"] == 2 and g["coco"]["parse_failures"] == 2
        assert g["coco"]["truth_boxes"] == truth_boxes and g["coco"]["predicted_boxes"] == 0
        expected = 0.0 if truth_boxes else None
        assert all(g["coco"][k] == expected for k in ("ap", "ap50", "ap75", "ar1", "ar10", "ar100"))
        assert c["l2_4s_mean"] is None and c["parse_failures"] == 2     # planning beside it, apart
    assert "grounding answers: COCO AP" in printed
