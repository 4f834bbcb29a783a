"""What the fast decoding path relies on, checked on this device before anything is timed
(``wam-diff2 verify-device --parts probe``): library versions, SDPA with a boolean mask in bf16, and the
token choice of a step under the capture rules.

    ok = probe(torch.device("cuda"), Rows("probe"))
"""
from __future__ import annotations

from pathlib import Path


def probe(device, rows) -> bool:
    """What the fast path relies on, checked before anything is timed: a row (what, result, ok) each added to
    ``rows`` (a device_timing.Rows); whether every one is ok.

    - versions of torch, transformers and FlashInfer (or why FlashInfer cannot be used);
    - SDPA with a boolean mask [N, 1, Q, K] in bf16 under each backend alone (which ones accept it), and a
      step's own call (grouped heads folded into the queries) under the pinned kernels (SDPA_STEP_BACKENDS);
    - the token choice of a step (greedy, and a seeded draw) under the capture rules: on CUDA captured in
      a graph whose registered generator replays the eager draws, elsewhere under HostSyncCheck."""
    import torch
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..decoding.attention import SDPA_STEP_BACKENDS, folded_bias, grouped_sdpa, sdpa_step_backends
    from ..decoding.cuda_graphs import HostSyncCheck
    from ..decoding.sampling import draw_one, greedy_pick

    ok = True

    def add(what, result, passed=True):
        nonlocal ok
        ok &= passed
        rows.add({"what": what, "result": result, "ok": "yes" if passed else "NO"})

    add("versions", f"torch {torch.__version__}, transformers {transformers.__version__}, "
                    f"CUDA {torch.version.cuda}; FlashInfer: {flashinfer_version()}")
    q = torch.randn(1, 16, 32, 128, device=device, dtype=torch.bfloat16)
    kv = torch.randn(1, 16, 300, 128, device=device, dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 32, 300, dtype=torch.bool, device=device).tril(diagonal=268)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), kv.float(), kv.float(), attn_mask=mask)
    accepted = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                got = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
            accepted.append(f"{backend.name.lower()} (max err {float((got.float() - want).abs().max()):.1e})")
        except RuntimeError:
            pass
    add("SDPA, bool mask, bf16: backends that run it", ", ".join(accepted) or "none", bool(accepted))
    pinned = SDPA_STEP_BACKENDS.get(device.type)
    try:                # a step's own call: grouped heads folded into the queries, under the pinned kernels
        with sdpa_step_backends(device):
            got = grouped_sdpa(q, kv[:, :8], kv[:, :8], folded_bias(mask, 2, q.dtype), 128 ** -0.5)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kv[:, :8].float().repeat_interleave(2, 1),
                                                               kv[:, :8].float().repeat_interleave(2, 1), attn_mask=mask)
        err = float((got.float() - ref.transpose(1, 2)).abs().max())
        add(f"step SDPA under the pinned kernels ({', '.join(b.name.lower() for b in pinned) if pinned else 'unpinned'})",
            f"runs (max err {err:.1e} against float32, unfolded)", err < 0.05)
    except RuntimeError as exc:
        add("step SDPA under the pinned kernels", f"{type(exc).__name__}: {exc}", False)
    logits = torch.randn(2, 32, 1000, device=device)
    banned = torch.tensor([0, 999], device=device)

    def pick(generator):
        greedy, _ = greedy_pick(banned)(logits)
        return greedy + draw_one(torch.softmax(logits, dim=-1), generator).squeeze(-1)

    try:
        if device.type == "cuda":
            generator = torch.Generator(device=device).manual_seed(5)
            alone = torch.Generator(device=device).manual_seed(5)
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                pick(torch.Generator(device=device))                          # warm-up, another generator
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            graph.register_generator_state(generator)
            with torch.cuda.graph(graph, stream=side):
                out = pick(generator)
            replays = []
            for _ in range(2):
                graph.replay()
                replays.append(out.clone())
            same = all(torch.equal(r, pick(alone)) for r in replays)
            add("token choice captured in a CUDA graph (registered generator)",
                "replays draw as eager" if same else "replays differ from eager draws", same)
        else:
            with HostSyncCheck():
                pick(torch.Generator(device=device).manual_seed(5))
            add("token choice under the capture rules (HostSyncCheck)", "no host sync")
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        add("token choice under the capture rules", f"{type(exc).__name__}: {exc}", False)
    return ok


def flashinfer_version() -> str:
    from ..decoding.attention_flashinfer import flashinfer_problem, import_flashinfer
    return flashinfer_problem() or getattr(import_flashinfer(), "__version__", "installed")


def torchao_version() -> str:
    try:
        import torchao
    except ImportError:
        return "not installed"
    return f"{torchao.__version__} ({Path(torchao.__file__).parent.parent})"
