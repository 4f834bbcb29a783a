"""scripts/gpu_verify.sh end to end on CPU (the small shape): the table, and exit status 1 when one
fast-path token is perturbed (the test hook). On a GPU machine the same script runs the 2B shape."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--device", "cpu", "--shape", "tiny", "--prompt-length", "64", "--repeats", "2", "--frames", "1",
         "--frame-size", "160", "90", "--new-tokens", "32", "--check-tokens", "32"]


def _verify(tmp_path, *extra):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "WHEELS": str(tmp_path / "none"),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_verify.sh"), *SMALL, *extra], env=env,
                          capture_output=True, text=True, timeout=600)


def test_gpu_verify_runs_end_to_end_on_cpu(tmp_path):
    done = _verify(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "fast tokens vs plain" in out and "4/4 rows agree" in out and "verify-device: tokens agree" in out
    for row in ("static-sdpa Block-32 forward", "static-sdpa AR forward", "Block-32 decode (static-sdpa)",
                "160x90 frame -> trajectory"):
        assert row in out, out
    result = json.loads((tmp_path / "out" / "verify.json").read_text())
    assert result["ok"] and result["decode"]["tokens_per_forward"] > 1                     # measured, not assumed
    sweep = result["decode"]["sweep"]             # the host's mask check every k steps never changes the tokens
    assert [r["interval"] for r in sweep] == [1, 2, 4, 8] and all(r["same_tokens"] for r in sweep)
    assert "mask_check_interval sweep" in out
    assert result["frame"]["p95_ms"] >= result["frame"]["p50_ms"] > 0


def test_gpu_verify_fails_on_one_perturbed_token(tmp_path):
    done = _verify(tmp_path, "--parts", "tokens", "--perturb-token")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "TOKEN MISMATCH" in done.stdout and "FAIL (needs 100%)" in done.stdout
