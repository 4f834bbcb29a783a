"""The evaluation report's Markdown: a run's ``report.md`` (frames, L2 in both conventions, speed error,
collision rate, PDM score, detection AP, per command, per waypoint, decoding and latency) and a
comparison's ``compare.md``; the PDM score's labels, which ``wam-diff2 eval-bag`` prints too.

    (out / "report.md").write_text(render_markdown(metrics))      # metrics: report.build_metrics
"""
from __future__ import annotations

from typing import Any, Sequence

from ..outputs.prompts import COMMANDS, NUM_WAYPOINTS
from ..profiling import stage_markdown
from .bag_pdm import AREA_RECORDED_DRIVE, AREA_ROUTE
from .metrics import (COLLISION_CONVENTIONS, CONVENTIONS, HORIZONS_S, PDM_SUBSCORES, SPEED_CONVENTION, WAYPOINT_TIMES_S,
                      horizon_key)
from .report_plots import PLOTS


def _f(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _l2_table(rows: Sequence[tuple[str, dict[str, Any]]], key: str) -> list[str]:
    hs = [horizon_key(h) for h in HORIZONS_S]
    lines = ["| | frames | " + " | ".join(f"L2 {h}" for h in hs) + " | mean 1-3 s | ADE | FDE |",
             "|---|---:|" + "---:|" * len(hs) + "---:|---:|---:|"]
    for name, m in rows:
        lines.append(f"| {name} | {m['frames']} | " + " | ".join(_f(m[key][h]) for h in hs)
                     + f" | {_f(m[key + '_mean_1_3s'])} | {_f(m['ade'])} | {_f(m['fde'])} |")
    return lines


def _collision_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Collision rates (%) at 1-4 s in both conventions, one row per (name, collision_metrics)."""
    hs = [horizon_key(h) for h in HORIZONS_S]
    lines = ["| | frames | " + " | ".join(f"UniAD {h}" for h in hs) + " | " + " | ".join(f"VAD {h}" for h in hs)
             + " | frames colliding |", "|---|---:|" + "---:|" * (2 * len(hs)) + "---:|"]
    for name, c in rows:
        lines.append(f"| {name} | {c['frames']} | " + " | ".join(_pct(c["at_t"][h]) for h in hs) + " | "
                     + " | ".join(_pct(c["avg_to_t"][h]) for h in hs) + f" | {c['frames_colliding']} |")
    return lines


def _speed_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Mean and median speed error (m/s) at 1-4 s, one row per (name, speed_error_metrics)."""
    hs = [horizon_key(h) for h in HORIZONS_S]
    lines = ["| | frames | " + " | ".join(f"mean {h}" for h in hs) + " | " + " | ".join(f"p50 {h}" for h in hs) + " |",
             "|---|---:|" + "---:|" * (2 * len(hs))]
    for name, e in rows:
        lines.append(f"| {name} | {e['frames']} | " + " | ".join(_f(e["mean_at_t"][h]) for h in hs) + " | "
                     + " | ".join(_f(e["p50_at_t"][h]) for h in hs) + " |")
    return lines


def render_speed(speed: dict[str, Any] | None, who: str = "model") -> list[str]:
    if speed is None:
        return []
    return ["## Speed error of the speed profile", "", SPEED_CONVENTION + ". m/s.", "",
            *_speed_rows([(who, speed["model"]), ("constant speed (same frames)", speed["constant_speed"])]), ""]


def render_collision(c: dict[str, Any] | None, topic: str = "") -> list[str]:
    if c is None:
        return []
    return ["## Collision rate", "",
            f"The planned ego box along the plan against the other agents' recorded boxes{' (`' + topic + '`)' if topic else ''} "
            "at each waypoint time; a step where the recorded ego itself overlaps an agent is not counted. "
            + COLLISION_CONVENTIONS["at_t"] + ". " + COLLISION_CONVENTIONS["avg_to_t"] + ".", "",
            *_collision_rows([("model", c["model"]), ("constant velocity (same frames)", c["constant_velocity"]),
                              ("constant velocity (all evaluated)", c["constant_velocity_all_frames"]),
                              ("recorded drive", c["recorded"])]), "",
            f"![collision rate]({PLOTS['collision']})", ""]


PDM_TABLE_HEAD = "| | frames | parsed | PDMS | " + " | ".join(k.upper() for k in PDM_SUBSCORES) + " |"
PDM_TABLE_RULE = "|---|---:|---:|---:|" + "---:|" * len(PDM_SUBSCORES)
AREA_LABELS = {AREA_ROUTE: "the route", AREA_RECORDED_DRIVE: "the recorded drive (no usable route)"}


def render_detection(d: dict[str, Any] | None) -> list[str]:
    """The node's recorded boxes against the bag's objects (``bag_detection``); nothing without detections."""
    if d is None:
        return []
    c = d["counts"]
    lines = ["## Detection (the node's boxes, COCO AP)", "",
             f"Boxes published on {', '.join(f'`{t}`' for t in d['topics'])}: {c['messages']} messages, {c['matched']} "
             f"scored against what the camera saw of the bag's objects at their stamp ({d['truth_boxes']} boxes), "
             f"{c['no_objects']} without objects and {c['no_pose']} without odometry there, {c['unmatched_stamp']} "
             f"matching no camera frame, {c['duplicate']} duplicates, {c['undecodable']} undecodable.", ""]
    sc = d["scores"]
    if not sc:
        return lines
    lines += [f"pycocotools {sc['library']}; {sc['parse_failures']} answers did not parse (their objects count as "
              "missed); boxes without a score rank as 1.0 in stamp order.", "",
              "| AP@[.5:.95] | AP50 | AP75 | AR@1 | AR@10 | AR@100 | predicted boxes |",
              "|---:|---:|---:|---:|---:|---:|---:|",
              "| " + " | ".join(_f(sc[k]) for k in ("ap", "ap50", "ap75", "ar1", "ar10", "ar100"))
              + f" | {sc['predicted_boxes']} |", "",
              "| class | AP | AP50 | ground truth | predicted |", "|---|---:|---:|---:|---:|",
              *[f"| {label} | {_f(v['ap'])} | {_f(v['ap50'])} | {v['truth']} | {v['predicted']} |"
                for label, v in sc["per_class"].items()],
              *(["| vehicles (" + "/".join(sc["vehicles"]["classes"]) + f", one class) | {_f(sc['vehicles']['ap'])} | "
                 f"{_f(sc['vehicles']['ap50'])} | {sc['vehicles']['truth']} | {sc['vehicles']['predicted']} |"]
                if sc["vehicles"]["truth"] else []), "",
              f"![detection AP]({PLOTS['detection']})", ""]
    return lines


def pdm_area_label(pdm: dict[str, Any], lane_width_m: float) -> str:
    """What the PDM score's drivable area was: a corridor, not a map (the report's and the CLI's words)."""
    where = "; ".join(f"{AREA_LABELS[a]} on {n} frames" for a, n in pdm["areas"].items())
    return f"a {lane_width_m:g} m corridor (--lane-width-m) around {where}, not a map"


def pdm_rows(pdm: dict[str, Any], who: str = "model") -> list[tuple[str, dict[str, Any]]]:
    return [(who, pdm["model"]), ("constant velocity", pdm["constant_velocity"]), ("recorded drive", pdm["recorded"])]


def render_pdm(pdm: dict[str, Any] | None, lane_width_m: float, topic: str = "", who: str = "model") -> list[str]:
    if pdm is None:
        return []
    lines = ["## PDM score (NAVSIM v1)", "",
             "NAVSIM v1's PDM score (`wam_diff2_core/pdm/`), PDMS = NC x DAC x (5 EP + 5 TTC + 2 C) / 12, of "
             f"each plan on the {pdm['frames']} frames with the recorded objects near their stamp. From the bag, "
             f"not NAVSIM's inputs: the agents are the recorded objects{' (`' + topic + '`)' if topic else ''}, "
             "non-reactive, every 0.1 s for 5 s; **the drivable area is " + pdm_area_label(pdm, lane_width_m)
             + "** (no lanes, no intersections); **EP's reference planner is the recorded drive** (its progress x "
             "NC x DAC), not PDM-Closed. PDMS is the mean over the frames (a plan that does not parse scores 0), "
             "the sub-scores are means over the parsed plans.", "",
             PDM_TABLE_HEAD, PDM_TABLE_RULE]
    return lines + _pdm_table_rows(pdm_rows(pdm, who)) + [""]


def _pdm_table_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """One table row per (name, :func:`~.metrics.pdm_means`): frames, parsed, PDMS, sub-scores."""
    return [f"| {name} | {p['pdm_samples']} | {p['pdm_parsed']} | {_f(p['pdms'])} | "
            + " | ".join(_f(p[k]) for k in PDM_SUBSCORES) + " |" for name, p in rows]


def render_markdown(m: dict[str, Any]) -> str:
    o, counts = m["overall"], m["counts"]
    title = f"# Open-loop evaluation{': ' + m['label'] if m.get('label') else ''}"
    model = m["model"]
    decoding = model.get("decoding") or {}
    from_node = model.get("source") == "predictions"
    if from_node:      # --predictions: what a planner node published, no model run here
        source = [f"- predictions: what the planner node published, read from `{p['path']}` topic `{p['topic']}` "
                  f"(for `{p['bag']}`); no model was run by the evaluator" for p in model.get("predictions", [])]
        if model.get("block_sizes"):
            source.append("- block size in the published decode statistics: "
                          + ", ".join(f"{b} ({n} frames)" for b, n in model["block_sizes"].items()))
    else:
        source = [f"- model: `{model.get('path', '?')}`" + (f" (block size {decoding.get('block_size')}, "
                                                           f"threshold {decoding.get('confidence_threshold')}, "
                                                           f"max {decoding.get('max_new_tokens')} tokens)"
                                                           if decoding else "")]
    lines = [title, "", *source,
             *[f"- bag: `{b['bag']['path']}` ({b['bag']['storage']}, {b['bag']['duration_s']:.1f} s, "
               f"odometry frame `{b['odometry_frame'] or '?'}`)" for b in m["bags"]],
             f"- created {m['created']}" + (f" by `{m['command']}`" if m.get("command") else ""), "",
             "## Frames", "",
             "| camera frames | not selected (every N / max) | skipped | excluded: < 4 s recorded future | evaluated | valid plans |",
             "|---:|---:|---:|---:|---:|---:|",
             f"| {counts['images']} | {counts['not_selected']} | {sum(counts['skipped'].values())} | "
             f"{sum(counts['excluded_no_future'].values())} | {counts['evaluated']} | {counts['valid']} |", ""]
    if counts["skipped"]:
        lines += ["Skipped: " + ", ".join(f"{k} {v}" for k, v in counts["skipped"].items()) + ".", ""]
    if counts["excluded_no_future"]:
        lines += ["Excluded: " + ", ".join(f"{k} {v}" for k, v in counts["excluded_no_future"].items()) + ".", ""]
    if "predictions" in counts:
        pc = counts["predictions"]
        lines += [f"Published trajectories: {pc['messages']} messages; {pc['matched']} matched a scored frame by "
                  f"stamp, {pc['unscored_frame']} answered a frame that is not scored, {pc['unmatched_stamp']} "
                  f"matched no camera frame, {pc['duplicate']} duplicates, {pc['undecodable']} undecodable; "
                  f"{pc['command_differs']} matched frames with another command than the evaluator derives. Scored "
                  f"frames the node did not answer are skipped as `not_published`.", ""]
    lines += [f"Parse failures: {o['parse_failures']} of {o['frames']} ({_pct(o['parse_failure_rate'])})"
              + (": " + ", ".join(f"{k} {v}" for k, v in o["invalid_reasons"].items()) if o["invalid_reasons"] else "")
              + ". L2 is scored on the frames with a valid plan only; the constant-velocity baseline (the ego keeps "
              "its input velocity) on the same frames, and on all evaluated frames for reference.", ""]
    objects_topic = next((b["counts"].get("objects_topic", "") for b in m["bags"]), "")
    rows = [("model", o["model"]), ("constant velocity (same frames)", o["constant_velocity"]),
            ("constant velocity (all evaluated)", o["constant_velocity_all_frames"])]
    lines += ["## L2 at t (UniAD convention)", "", CONVENTIONS["l2_at_t"] + ". Metres.", "",
              *_l2_table(rows, "l2_at_t"), "",
              *render_speed(o.get("speed_profile"), "node" if from_node else "model"),
              "## L2 averaged up to t (ST-P3 / VAD convention)", "", CONVENTIONS["l2_avg_to_t"] + ". Metres.", "",
              *_l2_table(rows, "l2_avg_to_t"), "",
              *render_collision(o.get("collision"), objects_topic),
              *render_pdm(o.get("pdm"), m["settings"]["lane_width_m"], objects_topic,
                          "node" if from_node else "model"),
              *render_detection(m.get("detection")),
              "## Per command (L2 at t, UniAD convention)", "",
              "| command | frames | valid | parse failures | model L2 1s | 2s | 3s | 4s | ADE | FDE | CV L2 4s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in COMMANDS:
        g = m["per_command"][c]
        at = g["model"]["l2_at_t"]
        lines.append(f"| {c} | {g['frames']} | {g['valid']} | {_pct(g['parse_failure_rate'])} | "
                     + " | ".join(_f(at[horizon_key(h)]) for h in HORIZONS_S)
                     + f" | {_f(g['model']['ade'])} | {_f(g['model']['fde'])} | "
                       f"{_f(g['constant_velocity']['l2_at_t'][horizon_key(HORIZONS_S[-1])])} |")
    pw, cv = o["model"]["per_waypoint"], o["constant_velocity"]["per_waypoint"]
    lines += ["", "## Per-waypoint mean error", "",
              "| t (s) | " + " | ".join(f"{t:g}" for t in WAYPOINT_TIMES_S) + " |",
              "|---|" + "---:|" * NUM_WAYPOINTS,
              "| model | " + " | ".join(_f(v) for v in pw) + " |",
              "| constant velocity | " + " | ".join(_f(v) for v in cv) + " |", "",
              f"![per-waypoint error]({PLOTS['per_waypoint']})", ""]
    d, lat = o["decode"], o["latency_ms"]
    lines += ["## Decoding and latency", "",
              "| forwards / frame (mean, median) | tokens / frame (mean, median) | tokens / forward | "
              "latency ms mean | p50 | p90 | p99 | max |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|",
              f"| {_f(d['forwards_per_frame']['mean'], 1)}, {_f(d['forwards_per_frame']['p50'], 1)} | "
              f"{_f(d['tokens_per_frame']['mean'], 1)}, {_f(d['tokens_per_frame']['p50'], 1)} | "
              f"{_f(d['tokens_per_forward'], 2)} | {_f(lat['mean'], 1)} | {_f(lat['p50'], 1)} | {_f(lat['p90'], 1)} | "
              f"{_f(lat['p99'], 1)} | {_f(lat['max'], 1)} |", "",
              ("Latency is the node's `DecodeStats.latency_ms`: its whole `policy.step` call (image "
               "preprocessing, decoding, parsing)." if from_node else
               "Latency is the whole `policy.step` call (image preprocessing, decoding, parsing) on "
               f"`{model.get('device', '?')}`."), "",
              *(["### Per stage (frame -> trajectory)", "", *stage_markdown(o["stages"]), ""] if o.get("stages") else []),
              f"![bird's-eye view of sample frames]({PLOTS['bev']})", "",
              f"![error histogram]({PLOTS['histogram']})", ""]
    if m.get("record"):
        lines += [f"Predictions recorded to `{m['record']}`.", ""]
    return "\n".join(lines)



def render_compare(r: dict[str, Any], na: str, nb: str, ma: dict[str, Any], mb: dict[str, Any]) -> str:
    hs = [horizon_key(h) for h in HORIZONS_S]

    def row(label, fn):
        return f"| {label} | {fn(ma)} | {fn(mb)} |"

    o = lambda m: m["overall"]   # noqa: E731
    lines = [f"# Comparison: {na} vs {nb}", "", f"- {na}: `{r['runs'][na]}`", f"- {nb}: `{r['runs'][nb]}`", "",
             "## Side by side (each on its own valid frames)", "", f"| | {na} | {nb} |", "|---|---:|---:|",
             row("frames evaluated", lambda m: o(m)["frames"]),
             row("valid plans", lambda m: o(m)["valid"]),
             row("parse failure rate", lambda m: _pct(o(m)["parse_failure_rate"]))]
    for h in hs:
        lines.append(row(f"L2 at {h} (UniAD)", lambda m, h=h: _f(o(m)["model"]["l2_at_t"][h])))
    for h in hs:
        lines.append(row(f"L2 avg to {h} (ST-P3/VAD)", lambda m, h=h: _f(o(m)["model"]["l2_avg_to_t"][h])))
    lines += [row("ADE", lambda m: _f(o(m)["model"]["ade"])), row("FDE", lambda m: _f(o(m)["model"]["fde"])),
              row("CV baseline L2 at 4s (same frames)",
                  lambda m: _f(o(m)["constant_velocity"]["l2_at_t"][hs[-1]])),
              row("forwards / frame", lambda m: _f(o(m)["decode"]["forwards_per_frame"]["mean"], 1)),
              row("tokens / frame", lambda m: _f(o(m)["decode"]["tokens_per_frame"]["mean"], 1)),
              row("tokens / forward", lambda m: _f(o(m)["decode"]["tokens_per_forward"], 2)),
              row("latency p50 (ms)", lambda m: _f(o(m)["latency_ms"]["p50"], 1)),
              row("latency p90 (ms)", lambda m: _f(o(m)["latency_ms"]["p90"], 1))]
    for c in COMMANDS:
        lines.append(row(f"{c}: L2 at 4s (frames)", lambda m, c=c: f"{_f(m['per_command'][c]['model']['l2_at_t'][hs[-1]])} "
                                                                   f"({m['per_command'][c]['valid']})"))
    p = r["common_valid_frames"]
    lines += ["", f"## On the {p['frames']} frames where both have a valid plan", "",
              f"| | {na} | {nb} | constant velocity |", "|---|---:|---:|---:|"]
    for conv, label in (("l2_at_t", "L2 at"), ("l2_avg_to_t", "L2 avg to")):
        for h in hs:
            lines.append(f"| {label} {h} | {_f(p[na][conv][h])} | {_f(p[nb][conv][h])} | "
                         f"{_f(p['constant_velocity'][conv][h])} |")
    lines += [f"| ADE | {_f(p[na]['ade'])} | {_f(p[nb]['ade'])} | {_f(p['constant_velocity']['ade'])} |", ""]
    if r.get("speed_profile"):
        v = r["speed_profile"]
        lines += ["## Speed error of the speed profile", "", SPEED_CONVENTION + ". m/s.", "",
                  "Each on its own valid frames:", "", *_speed_rows(list(v["runs"].items())), "",
                  "On the frames where both have a valid plan:", "",
                  *_speed_rows([(na, v["common_valid_frames"][na]), (nb, v["common_valid_frames"][nb]),
                                ("constant speed", v["common_valid_frames"]["constant_speed"])]), ""]
    if r.get("collision"):
        c = r["collision"]
        lines += ["## Collision rate", "", COLLISION_CONVENTIONS["at_t"] + ". "
                  + COLLISION_CONVENTIONS["avg_to_t"] + ".", "", "Each on its own valid frames:", "",
                  *_collision_rows([(na, c["runs"][na]), (nb, c["runs"][nb])]), "",
                  "On the frames where both have a valid plan:", "",
                  *_collision_rows([(na, c["common_valid_frames"][na]), (nb, c["common_valid_frames"][nb]),
                                    ("constant velocity", c["common_valid_frames"]["constant_velocity"])]), ""]
    if r.get("pdm"):
        p = r["pdm"]
        widths = " / ".join(f"{n}: {w:g} m" for n, w in p["lane_width_m"].items() if w is not None)
        lines += ["## PDM score (NAVSIM v1)", "", "Drivable area: a corridor around the route or the recorded drive "
                  f"(--lane-width-m {widths}), not a map; EP's reference: the recorded drive (each run's report "
                  "says more). Each on its own frames (an unparsed plan scores 0):", "",
                  PDM_TABLE_HEAD, PDM_TABLE_RULE, *_pdm_table_rows(list(p["runs"].items())), "",
                  "On the frames where both have a valid plan:", "", PDM_TABLE_HEAD, PDM_TABLE_RULE,
                  *_pdm_table_rows(list(p["common_valid_frames"].items())), ""]
    lines += ["L2 at t: " + CONVENTIONS["l2_at_t"] + ". L2 avg to t: " + CONVENTIONS["l2_avg_to_t"] + ".", "",
              "![per-waypoint error](per_waypoint_compare.png)", ""]
    return "\n".join(lines)
