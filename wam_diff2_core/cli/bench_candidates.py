"""``wam-diff2 bench --data SYNTH/val.json --candidates N``: the PDM score with and without candidate selection.

On a demo-world data set each planning sample is decoded once more with N plan candidates, as the planner
node decodes them (``policy.candidate_rows``: row 1 with the model's own settings, rows 2..N sampled, one
shared prefill); the candidate the frame's online scene scores best (what the node has: ego state, route
corridor, traffic moved on at constant velocity) is kept. Row 1 (what N = 1 publishes) and the kept candidate
are then scored by the data set's PDM score, so the two figures are paired; an unparsed answer scores 0.

    wam-diff2 bench --model B32 --data data/synth/val.json --tasks planning --candidates 4 --out bench/
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..candidate_selection import CandidateSettings


def decode_candidates(decoder, tokenizer, inputs, settings, candidates: CandidateSettings) -> list:
    """The N candidate plans of one planning sample's ``inputs`` (one prompt): [8, 2] waypoints, or None
    where a candidate does not parse."""
    from ..outputs.parsing import parse_waypoints
    from ..policy import candidate_rows

    rows = ["plan"] * candidates.count
    sampled, generators, greedy = candidate_rows(rows, settings, candidates, decoder.device)
    out = decoder.generate(inputs, sampled, generators=generators, greedy_rows=greedy, prompt_rows=[0] * len(rows))
    plans = [parse_waypoints(t) for t in tokenizer.batch_decode(out.sequences, skip_special_tokens=False)]
    return [p.waypoints if p.ok else None for p in plans]


def selection_row(sample_id: str, plans: list, pdm, candidates) -> dict[str, Any] | None:
    """A sample's paired scores: row 1's PDMS (no selection) and the kept candidate's; None when the data set
    does not know the sample."""
    scene = pdm.online_scene(sample_id, candidates.lane_width_m)
    if scene is None:
        return None
    selection = scene.select(plans, candidates.progress_reference)
    index = 0 if selection is None else selection.index

    def pdms(plan) -> float:
        return 0.0 if plan is None else float(pdm.score(sample_id, plan).pdms)
    without = pdms(plans[0])
    return {"id": sample_id, "valid": sum(p is not None for p in plans), "selected": index + 1,
            "pdms_without": without, "pdms_with": without if index == 0 else pdms(plans[index])}


def summarize(rows: list[dict[str, Any]], candidates: CandidateSettings, label: str) -> dict[str, Any]:
    """Means over the samples without and with selection, the paired difference and its 95 % bootstrap interval."""
    import numpy as np

    from ..evaluation.spread import bootstrap_interval

    pairs = np.array([[r["pdms_without"], r["pdms_with"]] for r in rows]).reshape(-1, 2)      # [n, 2]
    difference = pairs[:, 1] - pairs[:, 0]
    return {"label": label, "candidates": candidates.count,
            **{k: v for k, v in dataclasses.asdict(candidates).items() if k != "count"}, "samples": len(rows), "pdms_without": float(pairs[:, 0].mean()) if len(rows) else None,
            "pdms_with": float(pairs[:, 1].mean()) if len(rows) else None,
            "difference": float(difference.mean()) if len(rows) else None,
            "difference_interval": bootstrap_interval(difference, np.mean) if len(rows) else None,
            "changed": int(sum(r["selected"] != 1 for r in rows)),
            "valid_mean": float(np.mean([r["valid"] for r in rows])) if rows else None, "per_sample": rows}


def compare_selection(decoder, tokenizer, settings, samples, encoded, pdm, candidates: CandidateSettings,
                      label: str) -> dict[str, Any]:
    """Decode and score every planning sample of ``samples`` [(Sample, ground truth)] (``encoded``: their
    processor inputs, in order) with and without selection (module docstring)."""
    rows = [selection_row(sample.id, decode_candidates(decoder, tokenizer, inputs, settings, candidates), pdm,
                          candidates)
            for (sample, _), inputs in zip(samples, encoded) if pdm.inputs(sample.id) is not None]
    return summarize(rows, candidates, label)


def print_selection(result: dict[str, Any]) -> None:
    from ..evaluation.spread import format_with_interval

    r = result
    print(f"\ncandidate selection ({r['label']}, N = {r['candidates']}, temperature {r['temperature']:g}, top-p "
          f"{r['top_p']:g}; online scene: route corridor {r['lane_width_m']:g} m, traffic at constant velocity; EP "
          f"against the {r['progress_reference']} candidate) over {r['samples']} samples, paired")
    if not r["samples"]:
        print("  no planning sample of this data set to score")
        return
    print(f"  PDMS without selection (row 1) {r['pdms_without']:.3f}, with selection {r['pdms_with']:.3f}; "
          f"difference {format_with_interval(r['difference'], r['difference_interval'])} (95 % bootstrap); "
          f"selection changed the plan on {r['changed']} samples; valid candidates {r['valid_mean']:.2f} of "
          f"{r['candidates']} on average")
