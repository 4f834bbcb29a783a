"""Convert public driving data sets into the authors' sample format.

    wam-diff2 convert-data bench2drive /data/Bench2Drive-base data/b2d            # every clip under the folder
    wam-diff2 convert-data bench2drive /data/Bench2Drive-base data/b2d --resume   # continue after a stop

Bench2Drive: per clip ``camera/rgb_front/*.jpg`` and ``anno/*.json.gz``; one planning sample per
frame with 4 s of later frames (the NAVSIM prompt from the annotation's speed, acceleration and
command; 8 waypoints at 0.5 s in the ego frame). Missing or unreadable files are listed in
``OUT/report.json`` and never stop the other frames. See ``wam_diff2_core/data/bench2drive.py``.
"""
from __future__ import annotations


HELP = "convert a public data set (bench2drive) into planning samples"


def add_arguments(p) -> None:
    p.add_argument("dataset", choices=("bench2drive",), help="the data set's layout")
    p.add_argument("src", help="the data set folder (or one clip folder)")
    p.add_argument("out", help="output folder")
    p.add_argument("--resume", action="store_true", help="keep the clips already converted in OUT")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    p.add_argument("--frame-rate-hz", type=float, default=None, help="frames per second (default: Bench2Drive's 10)")
    p.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    from ..data import bench2drive
    from .common import config_errors

    with config_errors():
        summary = bench2drive.convert(args.src, args.out, resume=args.resume, overwrite=args.overwrite,
                                      frame_rate_hz=args.frame_rate_hz or bench2drive.FRAME_RATE_HZ,
                                      progress=not args.no_progress)
    print(f"convert-data bench2drive: {summary['samples']} planning samples from {summary['frames']} frames of "
          f"{len(summary['clips'])} clips ({summary['skipped_clips_done_before']} converted before); "
          f"{summary['problems']} missing or unreadable files (listed in {args.out}/report.json) -> "
          f"{args.out}/samples.json")
    return 0
