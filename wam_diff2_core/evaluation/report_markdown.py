"""The evaluation report's Markdown: a run's ``report.md`` (frames, L2 in both conventions, speed error,
collision rate, PDM score, detection AP, per command, per waypoint, decoding and latency) and a
comparison's ``compare.md``; the PDM score's labels, which ``wam-diff2 eval-bag`` prints too.

    (out / "report.md").write_text(render_markdown(metrics))      # metrics: report.build_metrics
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..outputs.prompts import COMMANDS
from ..profiling import stage_markdown
from .bag_pdm import AREA_RECORDED_DRIVE, AREA_ROUTE
from .metrics import COLLISION_CONVENTIONS, CONVENTIONS, PDM_SUBSCORES, SPEED_CONVENTION, STEPS, WAYPOINT_TIMES_S
from .report_plots import PLOTS

HS = list(STEPS)     # the horizons' keys: "1s" ... "4s"
AREA_LABELS = {AREA_ROUTE: "the route", AREA_RECORDED_DRIVE: "the recorded drive (no usable route)"}


def _f(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], rule: str = "|---|") -> list[str]:
    """A Markdown table: ``head`` (an empty first cell for a row-label column), ``rule`` then ``---:|`` for every
    other column, and a line per row."""
    return ["|" + "".join(f" {c} |" if c != "" else " |" for c in head), rule + "---:|" * (len(head) - 1),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def _l2_table(rows: Sequence[tuple[str, dict[str, Any]]], key: str) -> list[str]:
    return _table(["", "frames", *(f"L2 {h}" for h in HS), "mean 1-3 s", "ADE", "FDE"],
                  [[name, m["frames"], *(_f(m[key][h]) for h in HS), _f(m[key + "_mean_1_3s"]), _f(m["ade"]),
                    _f(m["fde"])] for name, m in rows])


def _collision_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Collision rates (%) at 1-4 s in both conventions, one row per (name, collision_metrics)."""
    return _table(["", "frames", *(f"UniAD {h}" for h in HS), *(f"VAD {h}" for h in HS), "frames colliding"],
                  [[name, c["frames"], *(_pct(c["at_t"][h]) for h in HS), *(_pct(c["avg_to_t"][h]) for h in HS),
                    c["frames_colliding"]] for name, c in rows])


def _speed_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Mean and median speed error (m/s) at 1-4 s, one row per (name, speed_error_metrics)."""
    return _table(["", "frames", *(f"mean {h}" for h in HS), *(f"p50 {h}" for h in HS)],
                  [[name, e["frames"], *(_f(e["mean_at_t"][h]) for h in HS), *(_f(e["p50_at_t"][h]) for h in HS)]
                   for name, e in rows])


def _pdm_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """One row per (name, :func:`~.metrics.pdm_means`): frames, parsed, PDMS, sub-scores."""
    return _table(["", "frames", "parsed", "PDMS", *(k.upper() for k in PDM_SUBSCORES)],
                  [[name, p["pdm_samples"], p["pdm_parsed"], _f(p["pdms"]), *(_f(p[k]) for k in PDM_SUBSCORES)]
                   for name, p in rows])


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
    v = sc["vehicles"]
    return lines + [
        f"pycocotools {sc['library']}; {sc['parse_failures']} answers did not parse (their objects count as "
        "missed); boxes without a score rank as 1.0 in stamp order.", "",
        *_table(["AP@[.5:.95]", "AP50", "AP75", "AR@1", "AR@10", "AR@100", "predicted boxes"],
                [[*(_f(sc[k]) for k in ("ap", "ap50", "ap75", "ar1", "ar10", "ar100")), sc["predicted_boxes"]]],
                rule="|---:|"), "",
        *_table(["class", "AP", "AP50", "ground truth", "predicted"],
                [[label, _f(s["ap"]), _f(s["ap50"]), s["truth"], s["predicted"]] for label, s in sc["per_class"].items()]
                + ([["vehicles (" + "/".join(v["classes"]) + ", one class)", _f(v["ap"]), _f(v["ap50"]), v["truth"],
                     v["predicted"]]] if v["truth"] else [])), "",
        f"![detection AP]({PLOTS['detection']})", ""]


def pdm_area_label(pdm: dict[str, Any], lane_width_m: float) -> str:
    """What the PDM score's drivable area was: a corridor, not a map (the report's and the CLI's words)."""
    where = "; ".join(f"{AREA_LABELS[a]} on {n} frames" for a, n in pdm["areas"].items())
    return f"a {lane_width_m:g} m corridor (--lane-width-m) around {where}, not a map"


def pdm_rows(pdm: dict[str, Any], who: str = "model") -> list[tuple[str, dict[str, Any]]]:
    return [(who, pdm["model"]), ("constant velocity", pdm["constant_velocity"]), ("recorded drive", pdm["recorded"])]


def render_pdm(pdm: dict[str, Any] | None, lane_width_m: float, topic: str = "", who: str = "model") -> list[str]:
    if pdm is None:
        return []
    return ["## PDM score (NAVSIM v1)", "",
            "NAVSIM v1's PDM score (`wam_diff2_core/pdm/`), PDMS = NC x DAC x (5 EP + 5 TTC + 2 C) / 12, of "
            f"each plan on the {pdm['frames']} frames with the recorded objects near their stamp. From the bag, "
            f"not NAVSIM's inputs: the agents are the recorded objects{' (`' + topic + '`)' if topic else ''}, "
            "non-reactive, every 0.1 s for 5 s; **the drivable area is " + pdm_area_label(pdm, lane_width_m)
            + "** (no lanes, no intersections); **EP's reference planner is the recorded drive** (its progress x "
            "NC x DAC), not PDM-Closed. PDMS is the mean over the frames (a plan that does not parse scores 0), "
            "the sub-scores are means over the parsed plans.", "", *_pdm_table(pdm_rows(pdm, who)), ""]


def _source(model: dict[str, Any]) -> list[str]:
    """What made the answers: a planner node's recorded predictions (``--predictions``) or a model run here."""
    if model.get("source") == "predictions":
        lines = [f"- predictions: what the planner node published, read from `{p['path']}` topic `{p['topic']}` "
                 f"(for `{p['bag']}`); no model was run by the evaluator" for p in model.get("predictions", [])]
        if model.get("block_sizes"):
            lines.append("- block size in the published decode statistics: "
                         + ", ".join(f"{b} ({n} frames)" for b, n in model["block_sizes"].items()))
        return lines
    decoding = model.get("decoding") or {}
    return [f"- model: `{model.get('path', '?')}`" + (f" (block size {decoding.get('block_size')}, threshold "
                                                     f"{decoding.get('confidence_threshold')}, max "
                                                     f"{decoding.get('max_new_tokens')} tokens)" if decoding else "")]


def render_markdown(m: dict[str, Any]) -> str:
    o, counts, model = m["overall"], m["counts"], m["model"]
    from_node = model.get("source") == "predictions"
    lines = [f"# Open-loop evaluation{': ' + m['label'] if m.get('label') else ''}", "", *_source(model),
             *[f"- bag: `{b['bag']['path']}` ({b['bag']['storage']}, {b['bag']['duration_s']:.1f} s, "
               f"odometry frame `{b['odometry_frame'] or '?'}`)" for b in m["bags"]],
             f"- created {m['created']}" + (f" by `{m['command']}`" if m.get("command") else ""), "",
             "## Frames", "",
             *_table(["camera frames", "not selected (every N / max)", "skipped", "excluded: < 4 s recorded future",
                      "evaluated", "valid plans"],
                     [[counts["images"], counts["not_selected"], sum(counts["skipped"].values()),
                       sum(counts["excluded_no_future"].values()), counts["evaluated"], counts["valid"]]],
                     rule="|---:|"), ""]
    for key, label in (("skipped", "Skipped"), ("excluded_no_future", "Excluded")):
        if counts[key]:
            lines += [f"{label}: " + ", ".join(f"{k} {v}" for k, v in counts[key].items()) + ".", ""]
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
    who = "node" if from_node else "model"
    rows = [("model", o["model"]), ("constant velocity (same frames)", o["constant_velocity"]),
            ("constant velocity (all evaluated)", o["constant_velocity_all_frames"])]
    lines += ["## L2 at t (UniAD convention)", "", CONVENTIONS["l2_at_t"] + ". Metres.", "",
              *_l2_table(rows, "l2_at_t"), "", *render_speed(o.get("speed_profile"), who),
              "## L2 averaged up to t (ST-P3 / VAD convention)", "", CONVENTIONS["l2_avg_to_t"] + ". Metres.", "",
              *_l2_table(rows, "l2_avg_to_t"), "",
              *render_collision(o.get("collision"), objects_topic),
              *render_pdm(o.get("pdm"), m["settings"]["lane_width_m"], objects_topic, who),
              *render_detection(m.get("detection")),
              "## Per command (L2 at t, UniAD convention)", "",
              *_table(["command", "frames", "valid", "parse failures", "model L2 1s", "2s", "3s", "4s", "ADE", "FDE",
                       "CV L2 4s"],
                      [[c, g["frames"], g["valid"], _pct(g["parse_failure_rate"]),
                        *(_f(g["model"]["l2_at_t"][h]) for h in HS), _f(g["model"]["ade"]), _f(g["model"]["fde"]),
                        _f(g["constant_velocity"]["l2_at_t"][HS[-1]])]
                       for c, g in ((c, m["per_command"][c]) for c in COMMANDS)]),
              "", "## Per-waypoint mean error", "",
              *_table(["t (s)", *(f"{t:g}" for t in WAYPOINT_TIMES_S)],
                      [["model", *map(_f, o["model"]["per_waypoint"])],
                       ["constant velocity", *map(_f, o["constant_velocity"]["per_waypoint"])]]), "",
              f"![per-waypoint error]({PLOTS['per_waypoint']})", ""]
    d, lat = o["decode"], o["latency_ms"]
    lines += ["## Decoding and latency", "",
              *_table(["forwards / frame (mean, median)", "tokens / frame (mean, median)", "tokens / forward",
                       "latency ms mean", "p50", "p90", "p99", "max"],
                      [[f"{_f(d['forwards_per_frame']['mean'], 1)}, {_f(d['forwards_per_frame']['p50'], 1)}",
                        f"{_f(d['tokens_per_frame']['mean'], 1)}, {_f(d['tokens_per_frame']['p50'], 1)}",
                        _f(d["tokens_per_forward"], 2), *(_f(lat[k], 1) for k in ("mean", "p50", "p90", "p99", "max"))]],
                      rule="|---:|"), "",
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
    def row(label, fn):
        return [label, fn(ma["overall"]), fn(mb["overall"])]

    side = [row("frames evaluated", lambda o: o["frames"]), row("valid plans", lambda o: o["valid"]),
            row("parse failure rate", lambda o: _pct(o["parse_failure_rate"])),
            *(row(f"L2 at {h} (UniAD)", lambda o, h=h: _f(o["model"]["l2_at_t"][h])) for h in HS),
            *(row(f"L2 avg to {h} (ST-P3/VAD)", lambda o, h=h: _f(o["model"]["l2_avg_to_t"][h])) for h in HS),
            row("ADE", lambda o: _f(o["model"]["ade"])), row("FDE", lambda o: _f(o["model"]["fde"])),
            row("CV baseline L2 at 4s (same frames)", lambda o: _f(o["constant_velocity"]["l2_at_t"][HS[-1]])),
            row("forwards / frame", lambda o: _f(o["decode"]["forwards_per_frame"]["mean"], 1)),
            row("tokens / frame", lambda o: _f(o["decode"]["tokens_per_frame"]["mean"], 1)),
            row("tokens / forward", lambda o: _f(o["decode"]["tokens_per_forward"], 2)),
            row("latency p50 (ms)", lambda o: _f(o["latency_ms"]["p50"], 1)),
            row("latency p90 (ms)", lambda o: _f(o["latency_ms"]["p90"], 1)),
            *([f"{c}: L2 at 4s (frames)", *(f"{_f(x['per_command'][c]['model']['l2_at_t'][HS[-1]])} "
                                             f"({x['per_command'][c]['valid']})" for x in (ma, mb))] for c in COMMANDS)]
    p = r["common_valid_frames"]
    lines = [f"# Comparison: {na} vs {nb}", "", f"- {na}: `{r['runs'][na]}`", f"- {nb}: `{r['runs'][nb]}`", "",
             "## Side by side (each on its own valid frames)", "", *_table(["", na, nb], side), "",
             f"## On the {p['frames']} frames where both have a valid plan", "",
             *_table(["", na, nb, "constant velocity"],
                     [[f"{label} {h}", *(_f(p[x][conv][h]) for x in (na, nb, "constant_velocity"))]
                      for conv, label in (("l2_at_t", "L2 at"), ("l2_avg_to_t", "L2 avg to")) for h in HS]
                     + [["ADE", *(_f(p[x]["ade"]) for x in (na, nb, "constant_velocity"))]]), ""]
    common = ["On the frames where both have a valid plan:", ""]
    if r.get("speed_profile"):
        v = r["speed_profile"]["common_valid_frames"]
        lines += ["## Speed error of the speed profile", "", SPEED_CONVENTION + ". m/s.", "",
                  "Each on its own valid frames:", "", *_speed_rows(list(r["speed_profile"]["runs"].items())), "",
                  *common, *_speed_rows([(na, v[na]), (nb, v[nb]), ("constant speed", v["constant_speed"])]), ""]
    if r.get("collision"):
        c = r["collision"]["common_valid_frames"]
        lines += ["## Collision rate", "", COLLISION_CONVENTIONS["at_t"] + ". " + COLLISION_CONVENTIONS["avg_to_t"] + ".",
                  "", "Each on its own valid frames:", "", *_collision_rows(list(r["collision"]["runs"].items())), "",
                  *common, *_collision_rows([(na, c[na]), (nb, c[nb]), ("constant velocity", c["constant_velocity"])]),
                  ""]
    if r.get("pdm"):
        pdm = r["pdm"]
        widths = " / ".join(f"{n}: {w:g} m" for n, w in pdm["lane_width_m"].items() if w is not None)
        lines += ["## PDM score (NAVSIM v1)", "", "Drivable area: a corridor around the route or the recorded drive "
                  f"(--lane-width-m {widths}), not a map; EP's reference: the recorded drive (each run's report "
                  "says more). Each on its own frames (an unparsed plan scores 0):", "",
                  *_pdm_table(list(pdm["runs"].items())), "", *common,
                  *_pdm_table(list(pdm["common_valid_frames"].items())), ""]
    lines += ["L2 at t: " + CONVENTIONS["l2_at_t"] + ". L2 avg to t: " + CONVENTIONS["l2_avg_to_t"] + ".", "",
              "![per-waypoint error](per_waypoint_compare.png)", ""]
    return "\n".join(lines)
