"""Losses: chunked == plain == an independent torch reference (values and gradients); JSD
properties; top-K overlap; chunking never builds logits for more than a chunk of positions."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from wam_diff2_core.trainer.losses import LossSettings, divergence, objective, top_k_overlap

V, H, M = 37, 8, 11


def _case(seed: int = 0, teacher_width: int = 6):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, H, generator=g, dtype=torch.float64)
    head = torch.nn.Linear(H, V, bias=False).double()
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g, dtype=torch.float64) * 2)
    teacher_head = torch.nn.Linear(teacher_width, V, bias=False).double().requires_grad_(False)
    with torch.no_grad():
        teacher_head.weight.copy_(torch.randn(V, teacher_width, generator=g, dtype=torch.float64) * 2)
    teacher_hidden = torch.randn(M, teacher_width, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (M,), generator=g)
    ce_weight = torch.rand(M, generator=g, dtype=torch.float64) + 0.1
    kd_weight = torch.rand(M, generator=g, dtype=torch.float64) + 0.1
    return hidden, head, targets, ce_weight, teacher_hidden, teacher_head, kd_weight


def _reference(hidden, head, targets, ce_weight, teacher_hidden, teacher_head, kd_weight, s: LossSettings):
    """Written from the spec with torch's own CE / KL, independently of losses.py."""
    logits = head(hidden)
    ce = (F.cross_entropy(logits, targets, reduction="none") * ce_weight).sum()
    if teacher_hidden is None:
        return (1 - s.kd_ratio) * ce
    t_logits = teacher_head(teacher_hidden)
    log_p = F.log_softmax(logits / s.temperature, -1)
    log_q = F.log_softmax(t_logits / s.temperature, -1)
    if s.kd_loss == "forward_kl":      # KL(Q || P)
        d = F.kl_div(log_p, log_q, log_target=True, reduction="none").sum(-1)
    elif s.kd_loss == "reverse_kl":    # KL(P || Q)
        d = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
    else:
        m = s.beta * log_q.exp() + (1 - s.beta) * log_p.exp()
        d = (s.beta * F.kl_div(m.log(), log_q, log_target=True, reduction="none").sum(-1)
             + (1 - s.beta) * F.kl_div(m.log(), log_p, log_target=True, reduction="none").sum(-1))
    kd = (d * kd_weight).sum() * s.temperature ** 2
    return (1 - s.kd_ratio) * ce + s.kd_ratio * kd


@pytest.mark.parametrize("kd_loss,kd_ratio,beta,temperature", [
    (None, 0.0, 0.5, 1.0), ("jsd", 1.0, 0.5, 1.0), ("jsd", 0.3, 0.2, 2.0),
    ("forward_kl", 1.0, 0.5, 1.5), ("reverse_kl", 0.5, 0.5, 0.7)])
@pytest.mark.parametrize("chunk_size", [1, 4, M, 100])
def test_chunked_equals_plain_and_reference(kd_loss, kd_ratio, beta, temperature, chunk_size):
    hidden, head, targets, ce_w, t_hidden, t_head, kd_w = _case()
    if kd_loss is None:
        t_hidden = t_head = kd_w = None
    s = LossSettings(chunk_size=chunk_size, kd_loss=kd_loss or "jsd", beta=beta, temperature=temperature,
                     kd_ratio=kd_ratio)
    results = {}
    for name in ("chunked", "plain", "reference"):
        h = hidden.clone().requires_grad_(True)
        head.zero_grad()
        if name == "reference":
            total = _reference(h, head, targets, ce_w, t_hidden, t_head, kd_w, s)
        else:
            total = objective(h, head, targets, ce_w, s, teacher_hidden=t_hidden, teacher_head=t_head,
                              kd_weight=kd_w, chunked=name == "chunked").total
        total.backward()
        results[name] = (total.detach(), h.grad.clone(), head.weight.grad.clone())
    for name in ("chunked", "plain"):
        for got, want in zip(results[name], results["reference"]):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_chunks_never_hold_more_than_chunk_size_positions():
    hidden, head, targets, ce_w, t_hidden, t_head, kd_w = _case()
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            seen.append(x.shape[0])
            return self.inner(x)

    s = LossSettings(chunk_size=3, kd_ratio=0.5)
    out = objective(hidden.requires_grad_(True), Spy(head), targets, ce_w, s, teacher_hidden=t_hidden,
                    teacher_head=Spy(t_head), kd_weight=kd_w)
    out.total.backward()
    assert max(seen) == 3
    # forward + recomputation in backward, student and teacher head per chunk
    assert sum(seen) == 4 * M


def test_logged_terms_are_the_parts_of_the_total():
    hidden, head, targets, ce_w, t_hidden, t_head, kd_w = _case()
    s = LossSettings(chunk_size=4, kd_ratio=0.25, temperature=2.0)
    out = objective(hidden, head, targets, ce_w, s, teacher_hidden=t_hidden, teacher_head=t_head, kd_weight=kd_w)
    torch.testing.assert_close(out.total.detach(), 0.75 * out.ce + 0.25 * out.kd)
    ce_only = objective(hidden, head, targets, ce_w, LossSettings(kd_ratio=0.0))
    torch.testing.assert_close(ce_only.total, out.ce)


def test_empty_selection_still_connects_the_graph():
    hidden = torch.randn(0, H, requires_grad=True)
    out = objective(hidden, torch.nn.Linear(H, V), torch.zeros(0, dtype=torch.long), torch.zeros(0), LossSettings())
    out.total.backward()
    assert float(out.total.detach()) == 0.0


logit_rows = st.lists(st.floats(-30, 30, allow_nan=False), min_size=5, max_size=5)


@settings(max_examples=60, deadline=None)
@given(a=st.lists(logit_rows, min_size=1, max_size=4), b=st.lists(logit_rows, min_size=1, max_size=4),
       temperature=st.floats(0.2, 5.0))
def test_jsd_is_symmetric_nonnegative_and_at_most_ln2(a, b, temperature):
    n = min(len(a), len(b))
    p = torch.tensor(a[:n], dtype=torch.float64)
    q = torch.tensor(b[:n], dtype=torch.float64)
    d_pq = divergence(p, q, "jsd", beta=0.5, temperature=temperature)
    d_qp = divergence(q, p, "jsd", beta=0.5, temperature=temperature)
    torch.testing.assert_close(d_pq, d_qp, rtol=1e-9, atol=1e-12)
    assert (d_pq >= -1e-12).all()
    assert (d_pq <= math.log(2) + 1e-9).all()
    torch.testing.assert_close(divergence(p, p, "jsd"), torch.zeros(n, dtype=torch.float64), atol=1e-12, rtol=0)


def test_jsd_reaches_ln2_for_disjoint_distributions_and_respects_beta_bound():
    p = torch.tensor([[60.0, -60.0]], dtype=torch.float64)
    q = torch.tensor([[-60.0, 60.0]], dtype=torch.float64)
    torch.testing.assert_close(divergence(p, q, "jsd"), torch.tensor([math.log(2)], dtype=torch.float64))
    # general beta: bounded by the binary entropy H(beta), reached for disjoint supports
    beta = 0.2
    h = -(beta * math.log(beta) + (1 - beta) * math.log(1 - beta))
    torch.testing.assert_close(divergence(p, q, "jsd", beta=beta), torch.tensor([h], dtype=torch.float64))


def test_kl_directions():
    p = torch.tensor([[2.0, 0.0, -1.0]], dtype=torch.float64)   # student
    q = torch.tensor([[0.0, 1.0, 0.5]], dtype=torch.float64)    # teacher
    sp, sq = p.softmax(-1), q.softmax(-1)
    torch.testing.assert_close(divergence(p, q, "forward_kl"), (sq * (sq / sp).log()).sum(-1))
    torch.testing.assert_close(divergence(p, q, "reverse_kl"), (sp * (sp / sq).log()).sum(-1))
    assert not torch.allclose(divergence(p, q, "forward_kl"), divergence(p, q, "reverse_kl"))


def test_top_k_overlap():
    s = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    assert float(top_k_overlap(s, s, 3)) == 1.0
    assert float(top_k_overlap(s, -s, 3)) == 0.0
    t = torch.tensor([[5.0, 0.0, 3.0, 2.0, 4.0, 1.0]])       # top-3 {0, 4, 2} vs student {0, 1, 2}
    assert float(top_k_overlap(s, t, 3)) == pytest.approx(2 / 3)
