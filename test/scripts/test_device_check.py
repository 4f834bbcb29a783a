"""The device check on CPU, the twin of the one device call: scripts/device_check.sh runs every part as its own
process under its own bound (the tiny shape, small frames), leaves its rows as measured and the table; verify-device
fails on one perturbed token, on a graph fallback, on a quantized mismatch; a part stopped at its bound leaves
the rows it had and fails the run. On a GPU machine the same script runs the 2B shape in bf16."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile

from test.support import REPO_ROOT as ROOT

SMALL = ["--prompt-length", "64", "--repeats", "2", "--frames", "2", "--frame-size", "160", "90", "--new-tokens", "32",
         "--check-tokens", "32", "--candidates", "2"]
# every part, with bounds for CI's 2 shared cores (the device's are the script's own)
CPU_PARTS = "probe:60 tests:240 tokens:240 forward:120 decode:120 frame:240 profile:60 compiled:300 quant:240"


def _device_check(tmp_path, parts: str, *extra, wheels: str = "none"):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "DEVICE": "cpu", "SHAPE": "tiny",
           "PARTS": parts, "WHEELS": str(tmp_path / wheels), "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), *SMALL, *extra], env=env,
                          capture_output=True, text=True, timeout=1800)


def _packed(tmp_path) -> dict[str, str]:
    with tarfile.open(tmp_path / "out" / "device_check.tar.gz") as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read().decode() for m in tar if m.isfile()}


def _rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_device_check_runs_every_part_on_cpu(tmp_path):
    done = _device_check(tmp_path, CPU_PARTS)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for part in ("probe", "tests", "tokens", "forward", "decode", "frame", "profile", "compiled", "quant"):
        assert f"== {part} (at most" in out and f"{part}: passed after" in out, out
    assert "device_check: every part passed" in out and "verify-device: every check passed" in out
    assert sorted(os.listdir(tmp_path / "out")) == ["device_check.tar.gz", "summary.txt"]   # within a call's 8 files
    raw = _packed(tmp_path)
    assert "skipped" in raw["tests.log"] and "failed" not in raw["tests.log"]        # no CUDA here: skipped, with why
    probe = {r["what"]: r for r in _rows(raw["probe.jsonl"])}
    assert all(r["ok"] == "yes" for r in probe.values())
    assert "math" in probe["SDPA, bool mask, bf16: backends that run it"]["result"]
    assert probe["token choice under the capture rules (HostSyncCheck)"]["result"] == "no host sync"
    tokens = _rows(raw["tokens.jsonl"])
    assert len(tokens) == 8 and not any("FAIL" in r["note"] for r in tokens)
    graphed = [r for r in tokens if r["variant"] == "static-sdpa-graph-emulated"]
    assert len(graphed) == 4 and all("replays of" in r["note"] for r in graphed)    # graphs ran, none fell back
    forward_rows = _rows(raw["forward.jsonl"])
    forward = {(r["variant"], r["step"]): r for r in forward_rows if "ms" in r}     # saved before the kernel counts
    kernels = {(r["kernels_of"], r["step"]): r for r in forward_rows if "kernels_of" in r}
    assert set(forward) == set(kernels) == {(v, s) for v in ("plain", "static-sdpa") for s in ("AR", "Block-32")}
    # what each launches here: the torch layer ops (CPU), each of their aten ops counted
    assert kernels[("static-sdpa", "Block-32")]["layer_kernels"] == "torch"
    assert kernels[("static-sdpa", "Block-32")]["kernels"] < kernels[("plain", "Block-32")]["kernels"]
    decode = _rows(raw["decode.jsonl"])
    sweep = [r for r in decode if "interval" in r]        # the host's mask check every k steps never changes tokens
    assert [r["interval"] for r in sweep] == [1, 2, 4, 8] and all(r["same_tokens"] for r in sweep)
    assert all(r["tokens_per_forward"] > 1 for r in sweep) and decode[-1]["plain_agreement"] == 1.0
    frame = _rows(raw["frame.jsonl"])
    assert frame[0]["warmup_s"] > 0 and frame[0]["layer_kernels"] == "torch"
    frames = [r for r in frame if "frame" in r]
    assert len(frames) == 2 and all(r["ms"] >= r["denoise_ms"] > 0 and r["vision_ms"] > 0 for r in frames)
    assert [r["candidates"] for r in frame if "candidates" in r] == [2]
    (profile,) = _rows(raw["profile.jsonl"])
    assert profile["kernels_dispatched"] == kernels[("static-sdpa", "Block-32")]["kernels"]
    compiled = _rows(raw["compiled.jsonl"])
    assert [r["case"] for r in compiled if "note" in r] == ["Block-32 greedy"]
    assert {r["variant"] for r in compiled if "ms" in r} == {"static-sdpa-compiled-graph-emulated",
                                                             "static-sdpa-graph-emulated"}
    assert {r["warmup_of"] for r in compiled if "warmup_of" in r} == {"static-sdpa-compiled-graph-emulated",
                                                                      "static-sdpa-graph-emulated"}
    quant = _rows(raw["quant.jsonl"])
    assert quant[0]["method"] == "int8" and sum("note" in r for r in quant) == 8
    assert any("int8: 14 linear layers" in r.get("weights", "") for r in quant)
    assert all(r["x_unquantized"] > 0 for r in quant if "ms" in r)
    summary = (tmp_path / "out" / "summary.txt").read_text()
    for row in ("fast tokens vs plain", "static-sdpa Block-32 kernels", "Block-32 decode (static-sdpa)",
                "mask_check_interval sweep", "160x90 frame -> trajectory", "frame stages (p50 ms)",
                "160x90 frame, 2 candidates", "profile, SDPA pin", "compiled forward tokens vs plain",
                "int8 fast tokens vs plain (same quantized weights)", "frame: passed after"):
        assert row in summary, summary


def test_a_part_stopped_at_its_bound_leaves_its_rows_and_fails_the_run(tmp_path, monkeypatch):
    """... and the script's scratch (the raw rows, the unpacked wheels) is gone with it: all of it is packed."""
    (tmp_path / "wheels").mkdir()
    with zipfile.ZipFile(tmp_path / "wheels" / "probe-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("scratch_probe.py", "")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    done = _device_check(tmp_path, "probe:60 tokens:3 decode:60", wheels="wheels")   # 3 s: tokens still importing
    assert done.returncode == 1, done.stdout + done.stderr
    assert "wheels from" in done.stdout
    assert [name for name in os.listdir(tmp_path / "tmp") if name.startswith("tmp.")] == []   # mktemp's; not torch's
    assert "probe: passed after" in done.stdout and "tokens: STOPPED at its bound" in done.stdout
    assert "decode: passed after" in done.stdout and "device_check: FAILED" in done.stdout
    raw = _packed(tmp_path)
    assert len(_rows(raw["probe.jsonl"])) == 4 and "tokens.log" in raw and raw["status.txt"].count("\n") == 3
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "probe" in summary and "mask_check_interval sweep" in summary and "tokens: STOPPED" in summary


def _verify(tmp_path, *extra):
    return subprocess.run([sys.executable, "-m", "wam_diff2_core.cli", "verify-device", "--device", "cpu", "--shape",
                           "tiny", *SMALL, "--out", str(tmp_path), *extra], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)


def test_verify_device_fails_on_one_perturbed_token(tmp_path):
    done = _verify(tmp_path, "--parts", "tokens", "--perturb-token")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "verify-device: FAILED" in done.stdout and "FAIL (needs 100%)" in done.stdout
    summary = subprocess.run([sys.executable, "-m", "wam_diff2_core.cli", "verify-device", "--summary", str(tmp_path)],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert summary.returncode == 1 and "7/8 rows agree" in summary.stdout


def test_a_graph_fallback_fails_the_token_check(monkeypatch):
    """A step that breaks a capture rule (here the index_put_ of a host scalar that ban_tokens used to do)
    falls back to eager with the same tokens: the graphed row must fail anyway, and so must the run."""
    import torch

    from wam_diff2_core.benchmark import token_check
    from wam_diff2_core.decoding import sampling

    def host_scalar_ban(logits, banned):
        logits = logits.clone()
        logits[..., banned] = float("-inf")
        return logits
    monkeypatch.setattr(sampling, "ban_tokens", host_scalar_ban)
    monkeypatch.setattr(token_check, "CHECK_LENGTHS", ((9,), (12,)))
    rows, ok = token_check.check_tokens(torch.device("cpu"), perturb=False, new_tokens=8)
    graphed = [r for r in rows if r["variant"].endswith("-emulated")]
    assert not ok and graphed and all(r["note"].startswith("FAIL graph fallbacks") for r in graphed)
    assert all("index_put" in r["note"] for r in graphed)
    assert all(r["note"] == "" for r in rows if r["variant"] == "static-sdpa")       # eager rows still agree


def test_the_quantized_token_check_fails_on_one_perturbed_token(monkeypatch):
    """The quant part's token check is the same gate: one changed token on int8 weights fails it."""
    import torch

    from wam_diff2_core.benchmark import token_check
    monkeypatch.setattr(token_check, "CHECK_LENGTHS", ((9,), (12,)))
    rows, ok = token_check.check_tokens(torch.device("cpu"), perturb=True, new_tokens=8, quantization="int8")
    assert not ok and rows[0]["dtype"] == "float32 int8" and rows[0]["note"].startswith("FAIL (needs 100%)")
    assert all(r["note"] == "" or "replays of" in r["note"] for r in rows[1:])


def test_without_torchao_the_quant_part_is_a_skipped_row_that_says_why(monkeypatch):
    from wam_diff2_core.benchmark.device_timing import DeviceCheck, Rows, check_quantized
    from wam_diff2_core.cli import verify_device
    from wam_diff2_core.config import ConfigError
    from wam_diff2_core.model import quantization

    def missing(method):
        raise ConfigError(f"quantization: {method} needs torchao, which is not installed")
    monkeypatch.setattr(quantization, "require_torchao", missing)
    rows = Rows("quant")
    assert check_quantized(None, None, DeviceCheck(), "int8", rows)
    assert rows.rows == [{"method": "int8", "skipped": "quantization: int8 needs torchao, which is not installed"}]
    table = verify_device.summary_rows({"quant": rows.rows})
    assert table == [{"what": "quantized int8", "value": f"skipped: {rows.rows[0]['skipped']}", "target": "-",
                      "met": "-"}]


def test_verify_device_refuses_a_candidate_count_outside_its_range(tmp_path):
    done = _verify(tmp_path, "--parts", "frame", "--candidates", "1")
    assert done.returncode == 2 and "--candidates [1]: each count must lie in 2..16" in done.stdout
