"""Token choice for one denoising step and the remasking strategies (docs/decoding.md, The algorithm).

Every function works on a whole block: logits [batch, block, vocab] in, tokens and their
confidences [batch, block] out. Sampling draws from one torch.Generator per sequence, so a
sequence decodes to the same tokens alone or in any batch. :class:`TokenChoices` is the static
decoder's choice per step (:class:`Pick`) and the generators its CUDA graphs draw from.
"""
from __future__ import annotations

import logging
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Callable, Hashable, Iterable, Iterator, Sequence

import torch

from ..config import DecodingSettings

log = logging.getLogger(__name__)


def device_settings(settings: DecodingSettings, device_type: str) -> DecodingSettings:
    """Per-device adjustments of the sampling method, applied by every decoder. Ascend NPUs hang in
    ``torch.multinomial``: there, sampling uses the inverse CDF (one uniform per position), as in the
    authors' NPU code."""
    if device_type == "npu" and settings.temperature > 0 and settings.sampler != "inverse_cdf":
        log.warning("device npu: sampling by inverse CDF instead of %s (multinomial hangs on Ascend)",
                    settings.sampler)
        return settings.replace(sampler="inverse_cdf")
    return settings


def seeded_generators(seeds: Iterable[int], device: torch.device | str) -> list[torch.Generator]:
    """One seeded generator per sequence, on the model's device: ``torch.multinomial`` / ``torch.rand``
    on cuda or npu tensors refuse a CPU generator."""
    return [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]


@contextmanager
def bound_generators(own: Sequence[torch.Generator], generators: Sequence[torch.Generator]) -> Iterator[None]:
    """Draw from ``own`` (a CUDA graph's registered generators, fixed objects) as if from ``generators``
    (the request's): each own generator takes its request generator's state on entry, which takes it back
    on exit, so the request's generators end where drawing from them directly would leave them."""
    for mine, theirs in zip(own, generators):
        mine.set_state(theirs.get_state())
    try:
        yield
    finally:
        for mine, theirs in zip(own, generators):
            theirs.set_state(mine.get_state())


def draw_one(p: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``p`` [..., V] drawn with probabilities ``p``: ``torch.multinomial(p, 1)``'s
    own rule (the exponential race, argmax p / E with E ~ Exp(1)), the same draws from the same generator
    state (a test pins it), without multinomial's validity check that reads the device from the host,
    so a CUDA graph can capture it."""
    race = torch.empty_like(p).exponential_(1, generator=generator)
    return (p / race).argmax(dim=-1, keepdim=True)


def ban_tokens(logits: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    """Remove MASK and other special ids: they can never be emitted. (``index_fill`` takes the scalar as a
    kernel argument; ``logits[..., banned] = -inf`` would copy it from the host: no CUDA graph captures that.)"""
    if banned is None or banned.numel() == 0:
        return logits
    return logits.index_fill(-1, banned, float("-inf"))


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """top-k, then nucleus top-p (the token that crosses p and the first token are kept)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        remove = cum > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


def sample_tokens(logits: torch.Tensor, settings: DecodingSettings, banned: torch.Tensor | None,
                  generators: Sequence[torch.Generator | None] | None = None,
                  rows: Sequence[int] | None = None,
                  greedy_rows: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick a token per position and its confidence p.

    logits: [batch, block, vocab]. Temperature 0: argmax and its softmax probability.
    Otherwise logits / T, top-k, top-p, sample (multinomial or inverse CDF), p = probability
    of the sampled token. ``rows`` limits random draws to those sequences (others get argmax),
    so a finished sequence consumes no random numbers. ``greedy_rows``: sequences that decode at
    temperature 0 in a sampling batch (their tokens and confidences are the greedy ones, they draw
    nothing), so one batch holds a greedy answer beside sampled ones, each as it would decode alone.
    """
    logits = ban_tokens(logits.float(), banned)
    if settings.temperature == 0.0:
        conf, tokens = torch.softmax(logits, dim=-1).max(dim=-1)
        return tokens, conf
    greedy = sorted(set(greedy_rows))
    if greedy:
        greedy_conf, greedy_tokens = torch.softmax(logits[greedy], dim=-1).max(dim=-1)
    scaled = filter_top_k_top_p(logits / settings.temperature, settings.top_k, settings.top_p)
    probs = torch.softmax(scaled, dim=-1)                          # [N, block, V]
    conf, tokens = probs.max(dim=-1)
    if greedy:
        tokens[greedy], conf[greedy] = greedy_tokens, greedy_conf
    for row in (range(probs.shape[0]) if rows is None else rows):
        if row in greedy:
            continue
        gen = generators[row] if generators is not None else None
        p = probs[row]                                             # [block, V]
        if gen is not None and gen.device.type != p.device.type:
            raise ValueError(f"generators: sequence {row}'s generator is on {gen.device}, the logits on "
                             f"{p.device}; make them on the model's device (seeded_generators)")
        if settings.sampler == "inverse_cdf":
            # One uniform per position; Ascend NPUs hang in torch.multinomial.
            u = torch.rand(p.shape[0], 1, generator=gen, device=p.device, dtype=p.dtype)
            idx = torch.searchsorted(p.cumsum(dim=-1), u, right=True).clamp_(max=p.shape[-1] - 1)
            # Floating-point mass past the last allowed token must not select a removed one.
            idx = torch.where(p.gather(-1, idx) > 0, idx, p.argmax(dim=-1, keepdim=True))
        else:
            idx = draw_one(p, gen)
        tokens[row] = idx.squeeze(-1)
        conf[row] = p.gather(-1, idx).squeeze(-1)
    return tokens, conf


GREEDY = DecodingSettings()


def greedy_pick(banned: torch.Tensor) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Token choice at temperature 0 (argmax and its probability): no host input, so it graphs."""
    return lambda logits: sample_tokens(logits, GREEDY, banned)


@dataclass(frozen=True)
class Pick:
    """The token choice of a step, the graph tag of its whole step (None: only its forward is graphed)
    and the generators it draws from (registered with that graph)."""

    fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    tag: Hashable | None
    generators: tuple[torch.Generator, ...] = ()

    def whole(self, step: Hashable) -> tuple | None:
        """The key suffix of the whole-step graph of ``step`` (a transfer rule, "ar") with this choice."""
        return None if self.tag is None else (step, self.tag)


class TokenChoices:
    """The static decoder's token choice per step, and the generators its sampling graphs draw from
    (``own``: fixed objects, as a graph is bound to the generators it captured)."""

    def __init__(self, banned: torch.Tensor, device: torch.device):
        self.banned, self.device = banned, device
        self.greedy = Pick(greedy_pick(banned), "greedy")
        self.own: list[torch.Generator] = []

    def pick(self, settings: DecodingSettings, generators, rows: Sequence[int], n: int,
             greedy_rows: Sequence[int] = ()) -> Pick:
        """The token choice of a step that draws for ``rows`` of the ``n`` sequences (``greedy_rows`` at
        temperature 0). Greedy steps graph whole; a sampling step does while every sequence still draws
        (the graph's draws are then the plain decoder's) from the device's default generator or from bound
        generators (:meth:`bind`); with greedy rows beside sampled ones only the forward is graphed."""
        if settings.temperature == 0:
            return self.greedy
        fn = partial(sample_tokens, settings=settings, banned=self.banned, generators=generators, rows=rows,
                     greedy_rows=greedy_rows)
        own = tuple(generators[:n]) if generators is not None else ()
        if greedy_rows or len(rows) < n or (own and any(g not in self.own for g in own)):
            return Pick(fn, None)
        tag = ("sample", n, settings.temperature, settings.top_k, settings.top_p, settings.sampler, bool(own))
        return Pick(fn, tag, own)

    def bind(self, graphed: bool, rows: int, settings: DecodingSettings,
             generators) -> tuple[Sequence[torch.Generator | None] | None, AbstractContextManager]:
        """The generators a sampling decode over ``rows`` cache rows draws from and the context that binds
        them: under CUDA graphs (``graphed``) the decoder's own, holding the request's states for the call
        (handed back at its end); otherwise the request's own (also when rows share a generator: their draws
        interleave, which separate bound copies would not)."""
        if (not graphed or settings.temperature == 0 or generators is None
                or len({id(g) for g in generators}) < len(generators)
                or any(g is None or g.device.type != self.device.type for g in generators)):
            return generators, nullcontext()
        while len(self.own) < rows:
            self.own.append(torch.Generator(device=self.device))
        own = self.own[:len(generators)]
        return own, bound_generators(own, generators)


def transfer_schedule(block_size: int, steps: int) -> list[int]:
    """Tokens to fix at each step for the static strategies: B spread evenly over min(S, B) steps."""
    steps = max(1, min(steps, block_size))
    base, extra = divmod(block_size, steps)
    return [base + (1 if k < extra else 0) for k in range(steps)]


def choose_transfer(masked: torch.Tensor, conf: torch.Tensor, settings: DecodingSettings,
                    step: int, schedule: Sequence[int]) -> torch.Tensor:
    """Which still-masked positions to fill this step. masked, conf: [batch, block] -> bool."""
    neg = torch.finfo(conf.dtype).min
    strategy = settings.remasking_strategy
    if strategy == "low_confidence_dynamic":
        scores = conf.masked_fill(~masked, neg)
        transfer = masked & (conf >= settings.confidence_threshold)
        # None over the threshold: fix the single most confident one.
        need = masked.any(dim=1) & ~transfer.any(dim=1)
        best = torch.zeros_like(masked).scatter_(1, scores.argmax(dim=1, keepdim=True), True)
        return transfer | (best & need.unsqueeze(1))
    if strategy == "low_confidence_static":
        scores = conf.masked_fill(~masked, neg)
    elif strategy == "sequential":
        pos = torch.arange(masked.shape[1], device=masked.device, dtype=conf.dtype)
        scores = (-pos).unsqueeze(0).expand_as(conf).masked_fill(~masked, neg)
    else:
        raise ValueError(f"remasking_strategy: unknown {strategy!r}")
    # A fixed k (no host sync): rows with fewer masked positions keep only their first n_row.
    n = schedule[min(step, len(schedule) - 1)]
    n_row = masked.sum(dim=1).clamp(max=n)                          # [N]
    top = torch.topk(scores, n, dim=1).indices                     # [N, n]
    keep = torch.arange(n, device=masked.device).unsqueeze(0) < n_row.unsqueeze(1)
    return torch.zeros_like(masked).scatter_(1, top, keep) & masked
