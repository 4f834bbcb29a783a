"""The token check of the fast decoding paths (``wam-diff2 verify-device``'s tokens and quant parts): every
fast variant against the plain decoder (:func:`check_tokens`) on a random model with head_dim 128 (the size of
the 2B and 8B models, and of FlashInfer's prebuilt kernels), greedy and seeded sampling, Block-32 and AR.

    rows, ok = check_tokens(torch.device("cpu"), perturb=False, new_tokens=64)
"""
from __future__ import annotations

from typing import Callable, Sequence

# The token-check model: head_dim 128 with grouped heads (2:1), small enough to decode in seconds.
CHECK_SHAPE = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=128, mrope_section=[24, 20, 20],
                   tie_word_embeddings=False)
# Prompt lengths of the token check: each batch size twice, both calls in one 256-slot key-span bucket
# (with the 64 answer slots); the last pair (GPU only) in the 512 bucket.
CHECK_LENGTHS = ((37,), (52,), (64, 23, 5), (61, 40, 12), (200, 90), (230, 120))
NEAR_TIE = 0.01     # bf16 teacher-forced check: a flip is legitimate below this share of the logits' range
# A compiled variant checks only its first case(s) on the single-sequence calls: each step shape costs a
# compile, and that case has two shapes (the step and the fused commit + step) where all cases over every
# batch bucket have six to fifteen. The GPU tests run the compiled forward in real graphs at B = 1 and 4.
COMPILED_CASES = 1


def fast_variants(device, dtype) -> list[str]:
    """The fast variants the token check runs: the device's, and off CUDA the graphed path with emulated
    graphs (the capture rules and fixed buffers checked without a GPU); not the compiled ones (each step shape
    is a compile: the device check's compiled part checks them)."""
    from .variants import available_variants
    names = [v for v in available_variants(device) if v != "plain" and "-compiled" not in v]
    if device.type != "cuda":
        names += ["static-sdpa-graph-emulated"]
    if "float32" in str(dtype):        # FlashInfer runs bf16 / fp16 only
        names = [v for v in names if "flashinfer" not in v]
    return names


def check_batches(device) -> list[dict]:
    """Left-padded random prompts: each batch size twice, with other prompt lengths in the same key-span
    bucket (a graph captured by the first call is replayed by the second)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    batches = []
    for lengths in CHECK_LENGTHS[:4 if device.type == "cpu" else None]:
        ids = torch.randint(0, CHECK_SHAPE["vocab_size"] - 8, (len(lengths), max(lengths)), generator=gen)
        mask = torch.zeros_like(ids)
        for r, n in enumerate(lengths):
            mask[r, max(lengths) - n:] = 1
        batches.append({"input_ids": ids.to(device), "attention_mask": mask.to(device)})
    return batches


def teacher_forced(fast, plain, batch, answers, config, size: int) -> tuple[int, float]:
    """The first answer block's logits with the plain decoder's tokens fed to both paths (no free running):
    (argmax disagreements where plain's top-2 margin exceeds NEAR_TIE of its logits' range, max |logit
    difference|). In bf16 the two paths' kernels round differently, so a near tie may flip; a flip at a
    clear margin is a defect."""
    import torch
    n = batch["input_ids"].shape[0]
    tokens = torch.full((n, size), config.eos_token_id, dtype=torch.long, device=batch["input_ids"].device)
    for row, answer in enumerate(answers):
        tokens[row, :min(size, len(answer))] = torch.tensor(answer[:size], dtype=torch.long)
    with torch.no_grad():
        want = plain.forward_block(plain.prefill(batch, size), tokens, 0, keep=False).float()
        state = fast.begin(batch, size, answer_slots=size)
        buf = fast.plan_step(state, [(0, size)])
        buf.tokens[:n].copy_(tokens)
        got = fast.forward(state, buf)[:n].float()
    top2 = want.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > NEAR_TIE * float(want.amax() - want.amin())
    flips = (got.argmax(dim=-1) != want.argmax(dim=-1)) & clear
    return int(flips.sum()), float((got - want).abs().max())


def check_tokens(device, perturb: bool, new_tokens: int, seed: int = 0, quantization: str = "none",
                 variants: Sequence[str] | None = None, on_row: Callable[[dict], object] | None = None,
                 compile_mode: str = "default") -> tuple[list[dict], bool]:
    """Fast variants against plain on a head_dim-128 random model: rows of the table, and ok.

    Each variant is warmed up as a node does, then decodes every case on two calls per batch size with
    other prompt lengths in the same key-span bucket (:func:`check_batches`; a compiled variant: its first
    case, single-sequence calls only;
    :data:`COMPILED_CASES`). float32: tokens identical. bf16: the free-running agreement is reported, the
    gate is :func:`teacher_forced` (no flip at a clear margin). A graphed row also fails on any graph
    fallback and when it replayed no graph. ``quantization``: the model's linear layers quantized first
    (both paths decode the same quantized weights). ``variants``: these instead of :func:`fast_variants`;
    ``on_row``: called with each row as it is measured."""
    import torch

    from ..decoding.sampling import seeded_generators
    from ..model.quantization import quantize_language_model
    from ..policy import token_agreement
    from ..model.random_model import build_random_model
    from .variants import make_variant

    dtypes = ("float32",) if device.type == "cpu" else ("float32", "bfloat16")
    batches = check_batches(device)
    rows, ok = [], True

    def add(row: dict) -> None:
        rows.append(row)
        if on_row:
            on_row(row)
    for dtype_name in dtypes:
        model, config = build_random_model(CHECK_SHAPE, device, getattr(torch, dtype_name), seed, 24.0)
        quantize_language_model(model, quantization)
        label = dtype_name if quantization == "none" else f"{dtype_name} {quantization}"
        plain = make_variant("plain", model, config)
        cases = [("Block-32 greedy", dict(block_size=32, denoising_steps=32)),
                 ("Block-32 sampled", dict(block_size=32, denoising_steps=32, temperature=1.0, top_k=50)),
                 ("AR greedy", dict(block_size=1, denoising_steps=1, max_new_tokens=max(1, new_tokens // 2))),
                 ("AR sampled", dict(block_size=1, denoising_steps=1, temperature=1.0, top_k=50,
                                     max_new_tokens=max(1, new_tokens // 2)))]
        for name in variants or fast_variants(device, dtype_name):
            try:
                fast = make_variant(name, model, config, compile_mode=compile_mode)
            except Exception as exc:  # noqa: BLE001 - a variant that cannot start is a failed row
                add(dict(dtype=label, variant=name, case="-", same="-", note=f"FAIL {type(exc).__name__}: {exc}"))
                ok = False
                continue
            graphs = getattr(fast, "graphs", None) if "-graph" in name else None
            variant_cases, variant_batches = cases, batches
            if "-compiled" in name:
                variant_cases = cases[:COMPILED_CASES]
                variant_batches = [b for b in batches if b["input_ids"].shape[0] == 1]
            for case, values in variant_cases:
                settings = config.settings.replace(**{"max_new_tokens": new_tokens, "confidence_threshold": 0.7, **values})
                fast.warmup(batch_sizes=sorted({b["input_ids"].shape[0] for b in variant_batches}),
                            prompt_tokens=variant_batches[0]["input_ids"].shape[1], settings=settings)
                replays = graphs.replays if graphs else 0
                same = total = flips = 0
                first, worst = None, 0.0
                for b, batch in enumerate(variant_batches):
                    n = batch["input_ids"].shape[0]
                    want = plain.generate(batch, settings, seeded_generators(range(n), device)).sequences
                    got = fast.generate(batch, settings, seeded_generators(range(n), device)).sequences
                    if perturb and not rows and b == 0:
                        got[0][0] += 1                               # the test hook: one token off
                    s, t, diff = token_agreement(got, want)
                    same, total = same + s, total + t
                    first = first or (diff and (b, *diff))
                    if dtype_name != "float32" or s != t:     # float32: only to say what a mismatch was
                        f, d = teacher_forced(fast, plain, batch, want, config, settings.block_size)
                        flips, worst = flips + f, max(worst, d)
                if dtype_name == "float32":
                    passed = same == total
                    note = "" if passed else (f"FAIL (needs 100%); first difference batch/answer/token/fast/plain {first}; "
                                              f"teacher-forced: {flips} flips at a clear margin, max |dlogit| {worst:.3g}")
                else:
                    passed = flips == 0
                    note = (f"teacher-forced: {flips} flips at a clear margin, max |dlogit| {worst:.3g}"
                            + ("" if passed else " FAIL"))
                if graphs is not None and (graphs.failures or graphs.replays == replays):
                    passed = False
                    why = next(iter(graphs.failures.values()), "no graph was replayed")
                    note = f"FAIL graph fallbacks {len(graphs.failures)}: {why}; " + note
                elif graphs is not None:
                    note = f"{graphs.replays - replays} replays of {len(graphs.graphs)} graphs " + note
                ok &= passed
                add(dict(dtype=label, variant=name, case=case, same=f"{same}/{total}", note=note))
        del model
    return rows, ok
