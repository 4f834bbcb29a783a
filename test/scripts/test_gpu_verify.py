"""scripts/gpu_verify.sh end to end on CPU (the small shape): the table, and exit status 1 when one
fast-path token is perturbed (the test hook). On a GPU machine the same script runs the 2B shape."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from test.support import REPO_ROOT as ROOT

SMALL = ["--device", "cpu", "--shape", "tiny", "--prompt-length", "64", "--repeats", "2", "--frames", "1",
         "--frame-size", "160", "90", "--new-tokens", "32", "--check-tokens", "32", "--candidates", "2"]


def _verify(tmp_path, *extra):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "WHEELS": str(tmp_path / "none"),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_verify.sh"), *SMALL, *extra], env=env,
                          capture_output=True, text=True, timeout=600)


def test_gpu_verify_runs_end_to_end_on_cpu(tmp_path):
    done = _verify(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "fast tokens vs plain" in out and "9/9 rows agree" in out and "verify-device: every check passed" in out
    tokens = json.loads((tmp_path / "out" / "verify.json").read_text())["tokens"]
    graphed = [r for r in tokens if r["variant"] == "static-sdpa-graph-emulated"]
    assert len(graphed) == 4 and all("replays of" in r["note"] for r in graphed)    # graphs ran, none fell back
    compiled = [r for r in tokens if r["variant"] == "static-sdpa-compiled-graph-emulated"]
    assert [r["case"] for r in compiled] == ["Block-32 greedy"] and "replays of" in compiled[0]["note"]
    for row in ("static-sdpa Block-32 forward", "static-sdpa AR forward", "Block-32 decode (static-sdpa)",
                "160x90 frame -> trajectory"):
        assert row in out, out
    result = json.loads((tmp_path / "out" / "verify.json").read_text())
    assert result["ok"] and result["decode"]["tokens_per_forward"] > 1                     # measured, not assumed
    assert result["decode"]["plain_agreement"] == 1.0                                      # the timed decode is plain's
    sweep = result["decode"]["sweep"]             # the host's mask check every k steps never changes the tokens
    assert [r["interval"] for r in sweep] == [1, 2, 4, 8] and all(r["same_tokens"] for r in sweep)
    assert "mask_check_interval sweep" in out
    probe = {r["what"]: r for r in result["probe"]}
    assert all(r["ok"] == "yes" for r in probe.values()) and "math" in probe[
        "SDPA, bool mask, bf16: backends that run it"]["result"]
    assert probe["token choice under the capture rules (HostSyncCheck)"]["result"] == "no host sync"
    assert result["frame"]["p95_ms"] >= result["frame"]["p50_ms"] > 0
    (quant,) = result["quant"]                  # the quant part, int8 by default: same tokens on quantized weights
    assert quant["method"] == "int8" and "int8: 14 linear layers" in quant["weights"]
    assert {r["variant"] for r in quant["tokens"]} == {"static-sdpa", "static-sdpa-graph-emulated"}
    assert all(r["same"].split("/")[0] == r["same"].split("/")[1] and "FAIL" not in r["note"] for r in quant["tokens"])
    assert [(r["variant"], r["step"]) for r in quant["forward"]] == [("static-sdpa", "AR"), ("static-sdpa", "Block-32")]
    assert all(r["x_unquantized"] > 0 and r["floor_ms"] < r["ms"] for r in quant["forward"])
    assert "int8 fast tokens vs plain (same quantized weights)" in out and "int8 static-sdpa Block-32 forward" in out
    # the candidates rows: N rows in one batched decode, timed per N beside one candidate
    assert set(result["frame"]["candidates_p50_ms"]) == {"2"} and result["frame"]["candidates_p50_ms"]["2"] > 0
    assert "160x90 frame, 2 candidates" in out and "ms per added row" in out


def test_gpu_verify_fails_on_one_perturbed_token(tmp_path):
    done = _verify(tmp_path, "--parts", "tokens", "--perturb-token")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "verify-device: FAILED" in done.stdout and "FAIL (needs 100%)" in done.stdout


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
    monkeypatch.setattr(token_check, "COMPILED_CASES", 0)       # no compile time: the graphed row shows it
    rows, ok = token_check.check_tokens(torch.device("cpu"), perturb=False, new_tokens=8)
    graphed = [r for r in rows if r["variant"].endswith("-emulated")]
    assert not ok and graphed and all(r["note"].startswith("FAIL graph fallbacks") for r in graphed)
    assert all("index_put" in r["note"] for r in graphed)
    assert all(r["note"] == "" for r in rows if r["variant"] == "static-sdpa")       # eager rows still agree


def test_device_check_runs_its_three_parts_on_cpu(tmp_path):
    """scripts/device_check.sh, the one device call, on CPU: probe, the GPU tests (skipped here, with the
    reason), then gpu_verify.sh; exit 0 and the closing line."""
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "DEVICE": "cpu", "SHAPE": "tiny",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), *SMALL[4:], "--parts", "tokens"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    for part in ("== 1. probe", "== 2. pytest -m gpu", "== 3. gpu_verify.sh", "device_check: every part passed"):
        assert part in done.stdout, done.stdout
    assert "skipped" in (tmp_path / "out" / "pytest.log").read_text()
    assert json.loads((tmp_path / "out" / "probe" / "verify.json").read_text())["ok"]


def test_the_quantized_token_check_fails_on_one_perturbed_token(monkeypatch):
    """The quant part's token check is the same gate: one changed token on int8 weights fails it."""
    import torch

    from wam_diff2_core.benchmark import token_check
    monkeypatch.setattr(token_check, "CHECK_LENGTHS", ((9,), (12,)))
    rows, ok = token_check.check_tokens(torch.device("cpu"), perturb=True, new_tokens=8, quantization="int8")
    assert not ok and rows[0]["dtype"] == "float32 int8" and rows[0]["note"].startswith("FAIL (needs 100%)")
    assert all(r["note"] == "" or "replays of" in r["note"] for r in rows[1:])


def test_without_torchao_the_quant_part_is_a_skipped_row_that_says_why(monkeypatch):
    from wam_diff2_core.benchmark.device_timing import check_quantized
    from wam_diff2_core.cli import verify_device
    from wam_diff2_core.config import ConfigError
    from wam_diff2_core.model import quantization

    def missing(method):
        raise ConfigError(f"quantization: {method} needs torchao, which is not installed")
    monkeypatch.setattr(quantization, "require_torchao", missing)
    quant, ok = check_quantized(None, None, None, "int8", [])
    assert ok and quant == {"method": "int8", "skipped": "quantization: int8 needs torchao, which is not installed"}
    rows = verify_device.summary_rows({"quant": [quant]})
    assert rows == [{"what": "quantized int8", "value": f"skipped: {quant['skipped']}", "target": "-", "met": "-"}]


def test_gpu_verify_refuses_a_candidate_count_outside_its_range(tmp_path):
    done = _verify(tmp_path, "--parts", "frame", "--candidates", "1")
    assert done.returncode == 2 and "--candidates [1]: each count must lie in 2..16" in done.stdout
