"""`routerops run PIPELINE [--set KEY=VALUE ...]`: the one front door to every pipeline (the make
targets call it). A pipeline with a Prefect flow runs as that flow; the critique pipelines, which have
none, run their stages in order, as `routerops stage NAME` would.

`--set orchestra.rl.max_steps=4` changes one value for this run without editing params.yaml: the
params file with the changes applied is written under <root>/.routerops/run/, checked by the
pipeline's own config loader first (an unknown or mistyped key is refused naming the `--set`), and the
pipeline reads it. Values are YAML (`--set materialise.families='[gcd, lcm]'`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from routerops.errors import InputError
from routerops.files import read_yaml_mapping
from stages.declarations import PIPELINES, Pipeline  # declared with their stages there


# The pipelines that run as a Prefect flow, each flow imported when its run starts (Prefect, MLflow and
# the routers take seconds to import; `routerops run --help` must not pay for them). The flows sit
# above the stages, so the stage table does not name them: only this top floor does. A pipeline
# without one runs its stages in order, as `routerops stage NAME` would.
def main_flow():
    from flows.pipeline import run_with_summary

    return run_with_summary


def mtrouter_flow():
    from flows.mtrouter import run_with_log

    return run_with_log


def orchestra_flow():
    from flows.orchestra import run_with_log

    return run_with_log


def arena_flow():
    from flows.arena import run_with_log

    return run_with_log


def retrain_flow():
    from flows.retrain import retrain

    return retrain


FLOWS: dict[str, Callable[[], Callable[..., Any]]] = {
    "main": main_flow, "mtrouter": mtrouter_flow, "orchestra": orchestra_flow, "arena": arena_flow,
    "retrain": retrain_flow}


def add_run_parser(sub) -> None:
    run = sub.add_parser("run", help="run a whole pipeline: " + ", ".join(PIPELINES),
                         description="\n".join(f"{name}: {p.help}" for name, p in PIPELINES.items()),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("name", metavar="PIPELINE", choices=list(PIPELINES))
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="change one params value for this run, e.g. orchestra.rl.max_steps=4 (repeatable)")
    run.add_argument("--params", default="params.yaml", help="relative to --root")
    run.add_argument("--root", default=".", help="where data/, reports/ and mlflow/ live")
    run.set_defaults(func=run_command)


def parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, value = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(part.strip() for part in parts):
        raise InputError("command line", "--set", f"expected KEY=VALUE with a dotted KEY, got {text!r}")
    try:
        return [p.strip() for p in parts], yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError as exc:
        raise InputError("command line", f"--set {key}", f"the value is not YAML: {exc.problem}") from None


def apply_overrides(params: dict, overrides: list[str]) -> dict:
    """`params` with each KEY=VALUE set (sections created as needed); the input is not changed."""
    out = yaml.safe_load(yaml.safe_dump(params)) or {}
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise InputError("command line", f"--set {text.partition('=')[0]}",
                                 f"{'.'.join(parts[:i + 1])} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return out


def params_for_run(name: str, root: Path, params: str, overrides: list[str]) -> Path:
    """The params file the pipeline reads: --params itself, or a copy with the overrides applied."""
    source = root / params
    if not overrides:
        return source
    changed = apply_overrides(read_yaml_mapping(source), overrides)
    target = root / ".routerops" / "run" / f"{name}.params.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    from routerops import schema  # pandas: only when a run has overrides, not at parse time

    schema.write_text_atomic(f"# {source} with: {' '.join(overrides)}\n" + yaml.safe_dump(changed, sort_keys=False),
                             target)
    return target


def check_config(pipeline: Pipeline, path: Path, overrides: list[str]) -> None:
    """The pipeline's own loader on the file it will read; an error in a key given with --set names it."""
    try:
        pipeline.config(path)
    except InputError as exc:
        for text in overrides:
            key = text.partition("=")[0].strip()
            if exc.field == key or exc.field.startswith(key + ".") or key.startswith(exc.field + "."):
                raise InputError("command line", f"--set {key}", exc.problem) from None
        raise


# The files the main pipeline's params name, each with the loader of its kind: a value such as
# `collect.price_book: /etc/shadow` is refused before any stage runs (issue 42 item 8).
MAIN_FILES = {"pool.file": "pool", "prices.collection": "price book", "prices.evaluation": "price book",
              "prices.replay": "price book"}
YAML_SUFFIXES = (".yaml", ".yml")


def check_files(pipeline_name: str, path: Path, root: Path, overrides: list[str]) -> None:
    """Each file the params name is a YAML file that loads as its kind (a pool, a price book); an
    error names the params key (or the `--set` that set it) and the file."""
    if pipeline_name != "main":
        return  # the other pipelines' loaders read their own files
    from routerops.pricing import load_pool, load_price_book  # pandas: once the parse is done

    loaders = {"pool": load_pool, "price book": load_price_book}
    raw = read_yaml_mapping(path)
    for key, kind in MAIN_FILES.items():
        section, _, name = key.partition(".")
        value = (raw.get(section) or {}).get(name)
        if value is None:
            continue
        file = Path(value) if Path(value).is_absolute() else root / value
        try:
            if file.suffix not in YAML_SUFFIXES:
                raise InputError(file, "<file>", f"is not a {' or '.join(YAML_SUFFIXES)} file")
            if not file.is_file():
                raise InputError(file, "<file>", "does not exist (paths are relative to --root)")
            loaders[kind](file)
        except InputError as exc:
            where = next((f"--set {key}" for text in overrides if text.partition("=")[0].strip() == key), key)
            source = "command line" if where.startswith("--set") else path
            kind = "price book" if section == "prices" else name.replace("_", " ")
            raise InputError(source, where, f"{value!r} is not a usable {kind}: {exc}") from None


@contextlib.contextmanager
def lock_root(root: Path) -> Iterator[None]:
    """One run per root: a second `routerops run` on the same root refuses at once, naming the pid
    and command that hold it (two runs on one root overwrote each other's data, and the first one's
    summary reported the second one's registered version). An advisory flock on the root folder
    itself: no file is written, and the kernel releases it when the holder exits, however it exits."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(root, "--root", f"is in use by {lock_holder(root)}; wait for it to end or give "
                             "another --root") from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def lock_holder(root: Path) -> str:
    """'pid N (its command line)' from /proc/locks, which lists each flock with its pid and inode."""
    info = os.stat(root)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "FLOCK" in fields and inode in fields:
                pid = fields[fields.index(inode) - 1]
                with contextlib.suppress(OSError):
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    return f"pid {pid} ({command[:120]})"
                return f"pid {pid}"
    return "another process"


@contextlib.contextmanager
def prefect_api() -> Iterator[None]:
    """The Prefect API a flow reports to: PREFECT_API_URL when set, else a temporary server this run
    starts and that dies with it, even on SIGKILL (services/prefect_server.py), instead of the one
    Prefect would start and leave running."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from services.prefect_server import temporary_prefect_server

    with temporary_prefect_server() as url, temporary_settings({PREFECT_API_URL: url}):
        os.environ["PREFECT_API_URL"] = url  # processes the flow starts (Dask workers) report there too
        try:
            yield
        finally:
            from cli.flow_runner import drain_prefect_workers

            drain_prefect_workers()  # the run's queued logs and events, while the server still listens
            os.environ.pop("PREFECT_API_URL", None)


def run_command(args: argparse.Namespace) -> None:
    from routerops.files import check_output
    from stages import run_stage

    root = Path(args.root)
    check_output(root, "--root", folder=True)
    pipeline = PIPELINES[args.name]
    with contextlib.ExitStack() as lock:
        locked = root.is_dir()
        if locked:  # before the --set copy is written: a second run must not replace it
            lock.enter_context(lock_root(root))
        params = params_for_run(args.name, root, args.params, args.overrides)
        check_config(pipeline, params, args.overrides)
        check_files(args.name, params, root, args.overrides)
        if not locked:  # a new root (--params given elsewhere): created once the checks passed
            root.mkdir(parents=True, exist_ok=True)
            lock.enter_context(lock_root(root))
        if args.name in FLOWS:
            flow = FLOWS[args.name]()
            with prefect_api():
                if hasattr(flow, "fn"):  # a Prefect flow itself: SIGTERM / Ctrl-C cancel it (cli/flow_runner.py)
                    from cli.flow_runner import prefect_home, run_flow_cancellable

                    run_flow_cancellable(flow, args.name, params, prefect_home(), params_file=str(params.resolve()),
                                         root=str(root))
                    return
                flow(params_file=str(params.resolve()), root=str(root))
            return
        for stage in pipeline.stages:
            print(run_stage(stage, str(params.resolve()), str(root)))
