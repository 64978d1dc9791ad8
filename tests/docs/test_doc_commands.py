"""Every `routerops` command in the serving docs' bash blocks parses with the CLI's own parsers, and
their settings files load: a renamed flag or a missing key fails here. What the commands do is run by
tests/e2e/test_journey_serve.py (register, serve --config, keys create/spend) and
tests/gateway/test_keys.py (keys list/revoke/set-budget/spend)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from cli import main as cli
from gateway.cli import add_gateway_parser
from gateway.settings import settings_from

REPO = Path(__file__).resolve().parents[2]
PAGES = ("docs/operations/serve.md", "docs/gateway/index.md")


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", (REPO / page).read_text(), flags=re.S):
            for line in block.splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith("routerops "):
                    found.append((page, shlex.split(line)[1:]))
    return found


COMMANDS = documented_commands()


def test_the_pages_document_the_journey():
    verbs = {" ".join(argv[:3]) if argv[0] == "gateway" else argv[0] for _, argv in COMMANDS}
    assert {"register", "gateway serve --config", "gateway keys create", "gateway keys list", "gateway keys spend",
            "gateway keys revoke", "gateway keys set-budget"} <= verbs, verbs


@pytest.mark.parametrize(("page", "argv"), COMMANDS, ids=[" ".join(a) for _, a in COMMANDS])
def test_a_documented_command_parses(page, argv):
    args, unknown = cli.build_parser().parse_known_args(argv)
    if args.command != "gateway":
        assert not unknown, f"{page}: {argv}: unknown {unknown}"
        return
    parser = cli.OneLineParser(prog="routerops")
    add_gateway_parser(parser.add_subparsers(dest="command", required=True))
    gateway_args = parser.parse_args(["gateway", *args.rest, *unknown])
    if gateway_args.gateway_command == "serve":
        settings = settings_from(gateway_args)  # the file loads and validates
        assert settings.routers, f"{page}: {argv} serves no router"
    assert isinstance(gateway_args, argparse.Namespace)
