"""``wam-diff2 tiny-checkpoint`` and ``wam-diff2 infer`` from the command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from wam_diff2_core.cli import main
from wam_diff2_core.outputs.prompts import format_planning_prompt

ANSWER = "2.26,-0.17,4.43,-0.70,6.52,-1.55,8.48,-2.64,10.28,-3.88,11.99,-5.25,13.76,-6.83,15.59,-8.59"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Five planning samples (seed format, relative image paths), one with a missing image and
    one malformed record; as JSON list and as JSONL."""
    root = tmp_path_factory.mktemp("data")
    (root / "img").mkdir()
    records = []
    for i in range(5):
        rng = np.random.default_rng(i)
        Image.fromarray((rng.random((72, 128, 3)) * 255).astype(np.uint8)).save(root / "img" / f"{i}.jpg")
        records.append({"id": f"s{i}", "datasource": "Navsim", "image": [f"img/{i}.jpg"], "conversations": [
            {"from": "human", "value": format_planning_prompt(("left", "straight", "right")[i % 3], (4.0 + i, 0.1), (0.2, -0.1))},
            {"from": "gpt", "value": ANSWER}]})
    records.append({"id": "missing-image", "image": ["img/nope.jpg"],
                    "conversations": [{"from": "human", "value": "<image> where?"}]})
    records.append({"id": "malformed", "conversations": []})
    (root / "eval.json").write_text(json.dumps(records))
    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


@pytest.fixture(scope="module")
def cli_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny"
    assert main(["tiny-checkpoint", str(out), "--seed", "0"]) == 0
    return out


def _infer(ckpt, dataset, output, *extra):
    return main(["infer", "--model", str(ckpt), "--input", str(dataset / "eval.json"), "--output", str(output),
                 "--device", "cpu", "--max-new-tokens", "48", *extra])


@pytest.mark.parametrize("block", ["1", "32"])
def test_infer_writes_a_record_per_sample(cli_checkpoint, dataset, tmp_path, block, capsys):
    out = tmp_path / "preds.json"
    assert _infer(cli_checkpoint, dataset, out, "--block-size", block, "--batch-size", "2") == 0
    printed = capsys.readouterr().out          # the per-stage table over the 3 batches of the 5 good samples
    assert "per stage, over 3 batches of up to 2" in printed
    for label in ("image conversion", "processor", "vision encoder", "prefill (text)", "denoise", "parse",
                  "batch -> records", "peak memory:"):
        assert label in printed, label
    records = json.loads(out.read_text())
    assert [r["id"] for r in records] == ["s0", "s1", "s2", "s3", "s4", "missing-image", "malformed"]
    for r in records[:5]:
        assert r["ground_truth"] == ANSWER and isinstance(r["prediction"], str)
        assert r["stats"]["block_size"] == int(block) and r["stats"]["tokens"] >= 1
        assert "waypoints" in r and (r["waypoints"] is None) == bool(r["parse_error"])
    assert "nope.jpg" in records[5]["error"] and "conversations" in records[6]["error"]
    assert not list(tmp_path.glob("*.partial.jsonl"))


def test_batching_does_not_change_predictions(cli_checkpoint, dataset, tmp_path):
    _infer(cli_checkpoint, dataset, tmp_path / "b1.jsonl", "--batch-size", "1")
    _infer(cli_checkpoint, dataset, tmp_path / "b3.jsonl", "--batch-size", "3")
    one = [json.loads(x) for x in (tmp_path / "b1.jsonl").read_text().splitlines()]
    three = [json.loads(x) for x in (tmp_path / "b3.jsonl").read_text().splitlines()]
    assert [r.get("prediction") for r in one] == [r.get("prediction") for r in three]


def test_resume_keeps_finished_records_and_drops_a_torn_line(cli_checkpoint, dataset, tmp_path):
    out = tmp_path / "preds.json"
    partial = tmp_path / "preds.json.partial.jsonl"
    marker = {"id": "s1", "prediction": "FROM-EARLIER-RUN", "ground_truth": ANSWER}
    partial.write_text(json.dumps(marker) + "\n" + '{"id": "s2", "predic')
    assert _infer(cli_checkpoint, dataset, out, "--resume") == 0
    records = {r["id"]: r for r in json.loads(out.read_text())}
    assert len(records) == 7 and records["s1"]["prediction"] == "FROM-EARLIER-RUN"
    assert records["s2"]["prediction"] != "FROM-EARLIER-RUN" and "stats" in records["s2"]
    assert not partial.exists()


def test_a_crash_leaves_no_output_and_a_resumable_partial(cli_checkpoint, dataset, tmp_path, monkeypatch):
    from wam_diff2_core.decoding import static as decoder_module     # what implementation auto runs on CPU
    calls = {"n": 0}
    real = decoder_module.StaticBlockDiffusionDecoder.generate

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return real(self, *a, **k)

    monkeypatch.setattr(decoder_module.StaticBlockDiffusionDecoder, "generate", flaky)
    out = tmp_path / "preds.json"
    with pytest.raises(RuntimeError):
        _infer(cli_checkpoint, dataset, out)
    assert not out.exists()
    partial = tmp_path / "preds.json.partial.jsonl"
    assert [json.loads(x)["id"] for x in partial.read_text().splitlines()] == ["s0", "s1"]
    monkeypatch.setattr(decoder_module.StaticBlockDiffusionDecoder, "generate", real)
    assert _infer(cli_checkpoint, dataset, out, "--resume") == 0
    assert len(json.loads(out.read_text())) == 7


def test_bad_model_path_is_a_clear_error(dataset, tmp_path, capsys):
    assert _infer(tmp_path / "nowhere", dataset, tmp_path / "p.json") == 2
    assert "checkpoint directory does not exist" in capsys.readouterr().err


def test_decoding_flags_are_derived_from_the_settings_dataclass():
    from wam_diff2_core.cli import build_parser
    from wam_diff2_core.config import DECODING_FIELDS
    text = build_parser()._subparsers._group_actions[0].choices["infer"].format_help()
    for name in DECODING_FIELDS:
        assert "--" + name.replace("_", "-") in text


@pytest.mark.slow
def test_torchrun_two_ranks_equal_one_process(cli_checkpoint, dataset, tmp_path):
    single = tmp_path / "single.json"
    assert _infer(cli_checkpoint, dataset, single) == 0
    multi = tmp_path / "multi.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           "-m", "wam_diff2_core.cli", "infer", "--model", str(cli_checkpoint), "--input", str(dataset / "eval.json"),
           "--output", str(multi), "--device", "cpu", "--max-new-tokens", "48"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _without_timings(json.loads(multi.read_text())) == _without_timings(json.loads(single.read_text()))


def _without_timings(records):
    """Records with the wall-time fields of their stats removed (they differ run to run)."""
    return [{**r, "stats": {k: v for k, v in r["stats"].items() if not k.endswith("_ms")}} if "stats" in r else r
            for r in records]


def test_static_engine_gives_the_plain_predictions(cli_checkpoint, dataset, tmp_path):
    _infer(cli_checkpoint, dataset, tmp_path / "plain.json", "--batch-size", "2", "--implementation", "plain")
    _infer(cli_checkpoint, dataset, tmp_path / "static.json", "--batch-size", "2", "--implementation", "static")
    plain, static = (json.loads((tmp_path / f).read_text()) for f in ("plain.json", "static.json"))
    assert [r.get("prediction") for r in static] == [r.get("prediction") for r in plain]
    with pytest.raises(SystemExit):
        _infer(cli_checkpoint, dataset, tmp_path / "x.json", "--implementation", "fast")


def test_engine_flags_are_checked_together(cli_checkpoint, dataset, tmp_path, capsys):
    assert _infer(cli_checkpoint, dataset, tmp_path / "x.json", "--implementation", "plain", "--cuda-graphs") == 2
    assert "need implementation static" in capsys.readouterr().err


def test_one_sided_pixel_budget_keeps_the_processors_other_bound(cli_checkpoint, dataset, tmp_path):
    """--max-pixels alone once failed every sample (and exited 0); now the processor's min applies."""
    out = tmp_path / "preds.json"
    assert _infer(cli_checkpoint, dataset, out, "--max-pixels", str(64 * 64), "--max-new-tokens", "8") == 0
    records = json.loads(out.read_text())
    assert all("error" not in r for r in records[:5])
    # a budget that cannot hold: the run's error, before any sample is decoded
    bad = tmp_path / "bad.json"
    assert _infer(cli_checkpoint, dataset, bad, "--min-pixels", "999999", "--max-pixels", "1024") == 2
    assert not bad.exists()


def test_threads_flag_sets_torch_threads(cli_checkpoint, dataset, tmp_path):
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _infer(cli_checkpoint, dataset, tmp_path / "p.json", "--threads", "1", "--max-new-tokens", "4") == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- hostile data
def _one_good_and(tmp_path, bad_line: str, *, name: str = "case.jsonl", files=()):
    """A JSONL file: the good sample s0, then ``bad_line``, then the good sample s1."""
    from test.support.hostile_data import huge_png, planning_record
    (tmp_path / "img").mkdir(exist_ok=True)
    for i in range(2):
        Image.fromarray((np.random.default_rng(i).random((72, 128, 3)) * 255).astype(np.uint8)).save(
            tmp_path / "img" / f"{i}.png")
    for f in files:
        (tmp_path / "img" / f).write_bytes(huge_png())
    path = tmp_path / name
    path.write_text("\n".join([json.dumps(planning_record("s0", ["img/0.png"])), bad_line,
                               json.dumps(planning_record("s1", ["img/1.png"]))]) + "\n")
    return path


@pytest.mark.parametrize("case, bad_line, error", [
    ("oversized image", json.dumps({"id": "big", "image": ["img/huge.png"],
                                    "conversations": [{"from": "human", "value": "<image> go"}]}),
     "sample big (line 2): image refused: too_large: "),
    ("non-object record", "[1, 2, 3]", "sample #2 (line 2): a JSON array, expected an object"),
    ("broken line", '{"id": "cut", "image": [', "sample #2 (line 2): invalid JSON at column"),
    ("wrong types", json.dumps({"id": "typed", "image": [], "conversations": [{"from": ["human"], "value": "x"}]}),
     "sample typed (line 2): turn 0 needs 'from'"),
])
def test_a_bad_record_is_its_own_error_and_the_run_completes(cli_checkpoint, tmp_path, case, bad_line, error):
    """Before: the oversized PNG crashed the run (PIL's DecompressionBombError) and crashed --resume
    again; a non-object record or a broken JSONL line aborted it; an unhashable 'from' was a TypeError."""
    data = _one_good_and(tmp_path, bad_line, files=["huge.png"])
    out = tmp_path / "preds.json"
    assert main(["infer", "--model", str(cli_checkpoint), "--input", str(data), "--output", str(out),
                 "--device", "cpu", "--max-new-tokens", "8"]) == 0
    records = json.loads(out.read_text())
    assert [(r["id"], r["line"]) for r in records if "prediction" in r] == [("s0", 1), ("s1", 3)]
    (bad,) = [r for r in records if "error" in r]
    assert bad["line"] == 2 and bad["error"].startswith(error), bad


def test_duplicate_ids_are_refused_up_front_with_their_lines(cli_checkpoint, tmp_path):
    """Before: both records of an id were decoded and one result overwrote the other."""
    from test.support.hostile_data import planning_record
    data = _one_good_and(tmp_path, json.dumps(planning_record("s0", ["img/1.png"])))
    out = tmp_path / "preds.json"
    assert main(["infer", "--model", str(cli_checkpoint), "--input", str(data), "--output", str(out),
                 "--device", "cpu", "--max-new-tokens", "8"]) == 0
    records = json.loads(out.read_text())
    assert [(r["id"], r["line"], "error" in r) for r in records] == [("s0", 1, True), ("s0", 2, True),
                                                                     ("s1", 3, False)]
    assert all("id 's0' is not unique (line 1; line 2)" in r["error"] for r in records[:2])


def test_every_sample_failing_is_a_failed_run(cli_checkpoint, tmp_path, capsys):
    data = tmp_path / "gone.json"
    data.write_text(json.dumps([{"id": f"g{i}", "image": [f"img/{i}.png"],
                                 "conversations": [{"from": "human", "value": "<image>"}]} for i in range(2)]))
    out = tmp_path / "preds.json"
    assert main(["infer", "--model", str(cli_checkpoint), "--input", str(data), "--output", str(out),
                 "--device", "cpu"]) == 1
    assert "every sample failed; the first: sample g0 (record 1, line 1): cannot read image" in capsys.readouterr().err
    assert [r["id"] for r in json.loads(out.read_text())] == ["g0", "g1"]          # the errors are still written


def test_a_checkpoint_without_its_chat_template_is_refused_at_load(cli_checkpoint, dataset, tmp_path, capsys):
    """Before: it loaded, every sample failed with 'cannot encode', and infer exited 0."""
    import shutil
    bare = tmp_path / "bare"
    shutil.copytree(cli_checkpoint, bare)
    (bare / "chat_template.jinja").unlink()
    assert _infer(bare, dataset, tmp_path / "p.json") == 2
    assert f"{bare}: no chat template" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_bad_image_limit_flags_are_refused(cli_checkpoint, dataset, tmp_path, capsys):
    assert _infer(cli_checkpoint, dataset, tmp_path / "p.json", "--max-decoded-pixels", "0") == 2
    assert "--max-decoded-pixels: must be an integer >= 1" in capsys.readouterr().err


def test_image_paths_outside_the_data_root_are_refused_unless_absolute_ones_are_allowed(cli_checkpoint, tmp_path):
    """Before: '../../etc/...' and absolute paths were read, decoded and answered."""
    from test.support.hostile_data import planning_record
    outside = tmp_path / "outside.png"
    Image.fromarray(np.zeros((72, 128, 3), np.uint8)).save(outside)
    (tmp_path / "root").mkdir()
    data = _one_good_and(tmp_path / "root", json.dumps(planning_record("abs", [str(outside)])))
    with data.open("a") as f:
        f.write(json.dumps(planning_record("up", ["../outside.png"])) + "\n")
    for flag, answered in (((), ["s0", "s1"]), (("--allow-absolute-image-paths",), ["s0", "abs", "s1"])):
        out = tmp_path / f"preds{len(flag)}.json"
        assert main(["infer", "--model", str(cli_checkpoint), "--input", str(data), "--output", str(out),
                     "--device", "cpu", "--max-new-tokens", "8", *flag]) == 0
        records = json.loads(out.read_text())
        assert [r["id"] for r in records if "prediction" in r] == answered
        assert all("is outside the data root" in r["error"] for r in records if "error" in r)
