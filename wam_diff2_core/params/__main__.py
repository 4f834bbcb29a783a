"""``python -m wam_diff2_core.params --write | --check | --markdown NODE | --yaml NODE``."""
import argparse
import sys

from .generated import TABLES, stale, write
from .spec import markdown_table, yaml_block

parser = argparse.ArgumentParser(prog="python -m wam_diff2_core.params", description=__doc__)
group = parser.add_mutually_exclusive_group(required=True)
group.add_argument("--write", action="store_true", help="rewrite config/*.yaml and the README / docs tables")
group.add_argument("--check", action="store_true", help="exit 1 when a checked-in generated file differs")
group.add_argument("--markdown", choices=tuple(TABLES), help="print a node's parameter table")
group.add_argument("--yaml", choices=tuple(TABLES), help="print a node's ros__parameters block")
args = parser.parse_args()
if args.write:
    for path in write():
        print(f"wrote {path}")
elif args.check:
    differing = stale()
    for path in differing:
        print(f"{path}: differs from the spec tables (python -m wam_diff2_core.params --write)", file=sys.stderr)
    sys.exit(1 if differing else 0)
elif args.markdown:
    print(markdown_table(TABLES[args.markdown].SPECS))
else:
    module = TABLES[args.yaml]
    print(yaml_block(module.SPECS, unset_note=getattr(module, "UNSET_NOTE", ())))
