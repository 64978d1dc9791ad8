"""How fast the CLI answers `--help`, a usage error and a bad path (issue 40, item 2): each command in a
fresh interpreter (`python -c` running cli.main.main, as the `routerops` script does), its exit
code, wall time (median of --repeat runs) and the number of modules imported. The module count is the
stable measure (the machine is shared: wall times move with its load); the tests hold it
(tests/cli/test_cli_imports.py).

    python benchmarks/cli_response.py [--repo .] [--repeat 3] [--out benchmarks/results/cli_response.json]

`--repo` measures another checkout (its code on PYTHONPATH), e.g. the commit before the change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["--help"],
    ["gateway", "serve", "--help"],
    ["gateway", "keys", "create", "--help"],
    ["replay", "--table", "/nonexistent", "--prices", "configs/prices/current.yaml"],
    ["run", "main", "--help"],
]
PROBE = """import json, sys
from cli.main import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, len(sys.modules)]), file=sys.__stdout__)
"""


def measure(repo: Path, argv: list[str], repeat: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    walls, code, modules = [], None, None
    for _ in range(repeat):
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=repo, env=env, capture_output=True,
                             text=True, timeout=300)
        walls.append(time.monotonic() - start)
        code, modules = json.loads(out.stdout.strip().splitlines()[-1])
    return {"command": "routerops " + " ".join(argv), "exit": code, "wall_s": round(statistics.median(walls), 2),
            "wall_s_runs": [round(w, 2) for w in walls], "modules": modules}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout measured")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="JSON result (default: print only)")
    args = parser.parse_args(argv)
    rows = [measure(args.repo.resolve(), command, args.repeat) for command in COMMANDS]
    result = {"benchmark": "cli_response", "repo": str(args.repo), "load_avg": os.getloadavg(), "commands": rows}
    for row in rows:
        print(f"{row['command']:78s} exit {row['exit']}  {row['wall_s']:5.2f} s  {row['modules']:5d} modules")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
