"""``python -m wam_diff2_ros.tools`` = ``wam-diff2-ros`` (for a Python without the console script)."""
import sys

from .cli import main

sys.exit(main())
