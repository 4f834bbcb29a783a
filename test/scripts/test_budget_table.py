"""scripts/budget_table.py on the tiny shape: each variant measured in its own process (a quantized one loaded
from the weights another process quantized and exported), the model's own peaks net of the process before it,
the weight bytes those of the model it built, the int4 packed size and the board projections computed from them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from test.support import REPO_ROOT as ROOT



def test_budget_table_measures_each_variant_in_its_own_process_and_projects_from_its_bytes(tmp_path):
    import torch

    from wam_diff2_core.model.random_model import build_random_model
    from wam_diff2_core.model.quantization import INT4_GROUP_SIZE, quantizable_linears

    out = tmp_path / "budget.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "budget_table.py"), "--shape", "tiny", "--variants",
                           "bfloat16", "bfloat16+int8", "bfloat16+int4", "--prompt", "16", "--repeats", "1",
                           "--threads", "1", "--kv-keys", "100", "--forwards-per-plan", "10", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert list(rows) == ["bfloat16", "bfloat16+int8", "bfloat16+int4"]
    pids = {r["pid"] for r in rows.values()}
    assert len(pids) == 3 and os.getpid() not in pids                     # one fresh process per variant
    for r in rows.values():
        assert r["run_peak_bytes"] > 0 and r["load_peak_bytes"] >= r["resident_bytes"] > 0
        assert r["prefill_s"] > 0 and r["block_forward_s"] > 0
        assert 0 < r["baseline_bytes"] <= r["load_peak_bytes"]                  # the process before the model
        assert r["model_load_peak_bytes"] == r["load_peak_bytes"] - r["baseline_bytes"]
        assert r["model_run_peak_bytes"] == r["run_peak_bytes"] - r["baseline_bytes"]
    for r in (rows["bfloat16+int8"], rows["bfloat16+int4"]):                # quantized in the exporting process
        assert r["model_quantize_at_load_peak_bytes"] == \
            r["quantize_at_load_peak_bytes"] - r["quantize_at_load_baseline_bytes"] > 0
    assert "model_quantize_at_load_peak_bytes" not in rows["bfloat16"]

    model, _ = build_random_model("tiny", torch.device("cpu"), torch.bfloat16, 0, 24.0)
    text = model.model.language_model
    read = {id(p): p for p in [*text.layers.parameters(), *text.norm.parameters(), *model.lm_head.parameters()]}
    assert rows["bfloat16"]["weight_bytes"] == sum(p.numel() * 2 for p in read.values())
    numel = sum(m.weight.numel() for m in quantizable_linears(model, "int4").values())
    head = model.lm_head.weight.numel()                  # untied here: the head and the table alike
    int8, int4 = rows["bfloat16+int8"], rows["bfloat16+int4"]
    assert int8["quantized_float_bytes"] == numel * 2 and numel <= int8["quantized_bytes"] < numel * 1.1
    assert int8["table_float_bytes"] == 2 * head * 2 and 2 * head <= int8["table_bytes"] < 2 * head * 1.1
    assert int8["weight_bytes"] == rows["bfloat16"]["weight_bytes"] - numel * 2 + int8["quantized_bytes"] \
        - head * 2 + int8["table_bytes"] // 2                                 # the LM head, int8: read per forward
    assert int4["packed_int4_bytes"] == numel // 2 + numel // INT4_GROUP_SIZE * 4

    kv = rows["bfloat16"]["kv_bytes_per_key_bf16"] * 100
    bf16, packed = rows["bfloat16"]["weight_bytes"] + kv, int4["weight_bytes"] - int4["quantized_bytes"] + \
        int4["packed_int4_bytes"] + kv
    orin = next(line for line in done.stdout.splitlines() if line.startswith("| Jetson AGX Orin 32 GB"))
    assert orin.split(" | ")[2] == f"{bf16 / 204.8e9 * 1e3:.1f} ms, {bf16 / 204.8e9 * 10 * 1e3:.0f} ms"
    assert orin.split(" | ")[4] == f"{packed / 204.8e9 * 1e3:.1f} ms, {packed / 204.8e9 * 10 * 1e3:.0f} ms |"
    for key, label in (("run_peak_bytes", "run peak RSS"), ("model_run_peak_bytes", "model's run peak")):
        ratio = int8[key] / rows["bfloat16"][key]
        assert f"int8 / bf16 {label}: {ratio:.2f}x (target <= 0.55x: {'met' if ratio <= 0.55 else 'MISSED'})" \
            in done.stdout
