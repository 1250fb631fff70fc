"""The distinct configs of one committed table and its route counts, for a sweep that measures every
pick at every density of the table (``h200_tables.sh cross``).

The picker serves a density off the table's grid with the nearest entry's config, and an entry is the
best of what its own sweep measured. A neighbour's pick may be faster at that density and never have
been tried there (V4-Flash TP2 gate/up at 3456 routes held a ``halves`` tile 0.666 ms while the picks on
either side, ``lut`` tiles, were never timed there; the picker then served it at 3840 routes, 1.15x the
direct sweep's best, session 15). Measuring every pick everywhere makes each entry at least as fast,
at its density, as any other entry's config.

    python benchmarks/table_picks.py -k fp4_prefill.gate_up -m deepseek-v4-flash --tp 2 \\
        --starts picks.json --max-routes 24576      # prints the routes, comma-separated
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moetune.models import get_model
from moetune.spec import canonical_json, get_spec
from moetune.tables import read, table_path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", "--kernel", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--configs", default="configs", help="table root")
    ap.add_argument("--starts", required=True, help="JSON file to write the distinct configs to")
    ap.add_argument("--max-routes", type=int, help="only entries up to this many routes")
    ap.add_argument("--routing", default="uniform")
    args = ap.parse_args()
    spec = get_spec(args.kernel)
    shape = spec.shape_from_model(get_model(args.model), args.tp)
    doc = read(table_path(args.configs, args.arch, args.kernel, shape))
    entries = [e for e in doc["entries"] if e["routing"] == args.routing and e["active_fraction"] == 1.0
               and (args.max_routes is None or e["routes"] <= args.max_routes)]
    configs = list({canonical_json(e["config"]): e["config"] for e in entries}.values())
    Path(args.starts).write_text(json.dumps(configs, indent=1) + "\n")
    print(",".join(str(r) for r in sorted({e["routes"] for e in entries})))


if __name__ == "__main__":
    main()
