"""dvc.lock is committed in sync with the code, dvc.yaml and params.yaml (issue 40: after `make demo`,
`git status` showed dvc.lock modified, because the committed lock was stale).

What can be checked without the data: each locked stage's command, its dependencies and outputs (as
paths), its params values, and the md5 and size of every dependency that is a file of the repository
(code, configs, bundled datasets); the outputs' hashes are the demo's data, recorded by its closing
`dvc commit`. When this fails, regenerate the lock with the pipeline itself and commit it:
`make demo && git add dvc.lock` (docs/operations/tests.md).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def tracked_files() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return set(out.splitlines())


def params_value(params: dict, dotted: str):
    node = params
    for part in dotted.split("."):
        node = node[part]
    return node


def declared_paths(entries: list) -> list[str]:
    """dvc.yaml's deps/outs: a path, or a one-key mapping {path: options} (an uncached output)."""
    return sorted(next(iter(e)) if isinstance(e, dict) else e for e in entries or [])


def test_the_committed_lock_matches_dvc_yaml_params_and_the_repository_files():
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    files = tracked_files()
    stale = []
    assert set(lock) == set(stages), f"stages in dvc.yaml but not in the lock: {set(stages) - set(lock)}"
    for name, stage in stages.items():
        locked = lock[name]
        if locked["cmd"] != stage["cmd"]:
            stale.append(f"{name}: cmd {locked['cmd']!r} != {stage['cmd']!r}")
        if sorted(d["path"] for d in locked.get("deps", [])) != declared_paths(stage.get("deps")):
            stale.append(f"{name}: deps differ from dvc.yaml")
        outs = [*(stage.get("outs") or []), *(stage.get("metrics") or []), *(stage.get("plots") or [])]
        if sorted(o["path"] for o in locked.get("outs", [])) != declared_paths(outs):
            stale.append(f"{name}: outs differ from dvc.yaml")
        for key, value in locked.get("params", {}).get("params.yaml", {}).items():
            if params_value(params, key) != value:
                stale.append(f"{name}: params.yaml {key} changed")
        for dep in locked.get("deps", []):
            path = REPO / dep["path"]
            if dep["path"] in files and path.is_file():
                data = path.read_bytes()
                if (hashlib.md5(data).hexdigest(), len(data)) != (dep["md5"], dep["size"]):
                    stale.append(f"{name}: {dep['path']} changed")
    assert not stale, ("dvc.lock is stale; regenerate it with `make demo && git add dvc.lock`:\n  "
                       + "\n  ".join(stale))
