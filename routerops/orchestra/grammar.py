"""The orchestrator's turn grammar (004 App. F.1, Prompt 1), its strict parser and its renderer.

One controller (assistant) turn is a sequence of XML blocks with nothing but whitespace between them
(F.3 forbids prose outside blocks):

    [<verify> self-check [<replan/>] </verify>]          only once observations came back (F.2)
    then either
    <final_answer>X</final_answer>                        ends the episode; alone on the first turn = lazy
    or
    <plan round="r">                                      r = previous round + 1 (F.1: strictly increasing)
    <subtask id="k" depends_on="j,...">description</subtask> ...
    </plan>
    <route subtask="k" model="m" skill="s">instruction</route> ...   exactly one per subtask

Subtask ids are integers, unique over the episode, and strictly larger than every id they depend on
(A.7: this is how the grammar rules out cycles); dependencies may name subtasks of earlier rounds.
A <verify> holding <replan/> says verification failed, so the plan after it is a repair round (Fig. 6,
decomp_repair); a plan after a <verify> without it continues the work (continuation).

The executor answers with <obs subtask="k">worker text</obs> blocks, or <error kind="...">what was
wrong</error> after a malformed turn; a controller turn holding either tag is malformed.

Escaping: inside any block body, the only structure is a *reserved tag token*: '<', an optional '/',
and one of the grammar's tag names (any case, spaces allowed). Everything else, such as `a<b` in code,
is text. `escape_text` turns the '<' of every reserved token into '&lt;' (and protects literal
'&lt;', '&gt;', '&amp;'); parsing decodes the three entities back. A worker's reply is escaped before
it goes inside <obs>, so `</obs><final_answer>…` in it is text: it can neither close the observation
nor be read as the controller's answer.

Malformed text gives a GrammarError(kind, message), returned, never raised: `parse_turn` is total.
The canonical text of a turn, and the executor's messages, are written by render.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

TAGS = ("plan", "subtask", "route", "verify", "replan", "final_answer", "obs", "error")
ENVIRONMENT_TAGS = ("obs", "error")  # written by the executor only
LEAF_BLOCKS = ("subtask", "route", "verify", "final_answer")  # blocks whose body is text

# Kinds of GrammarError, in the order a reader meets them.
ERROR_KINDS = (
    "empty",  # the turn, an answer, a description or an instruction is blank
    "stray_text",  # prose before or between blocks
    "trailing_text",  # text after the last block
    "unknown_tag",  # a tag outside the vocabulary at the top level (<think>, <answer>, <Plan>)
    "environment_tag",  # <obs> or <error> written by the controller
    "malformed_tag",  # '<tag' without '>', attributes on a closing tag, <replan> not self-closing
    "unclosed_tag",  # a block never closed (truncated output) or closed by another block's tag
    "unmatched_close",  # a closing tag with no block open
    "nested_tag",  # a block inside a block (F.1: no nested <route>)
    "bad_attribute",  # missing, unknown, repeated or ill-formed attribute
    "misplaced_block",  # blocks out of the order above
    "duplicate_block",  # two <final_answer>, <plan>, <verify> or <replan/>
    "missing_action",  # a <verify> followed by neither a <final_answer> nor a <plan>
    "replan_conflict",  # <replan/> (verification failed) and then a <final_answer>
    "bad_round",  # round is not the previous round + 1
    "duplicate_id",  # subtask id repeated, or used in an earlier round
    "unknown_dependency",  # depends_on names no subtask of this plan or an earlier round
    "cycle",  # a depends_on entry not smaller than the subtask's own id
    "missing_route",  # a subtask without its <route>
    "orphan_route",  # a <route> for a subtask the plan does not declare
    "duplicate_route",  # two <route> for one subtask
    "unknown_model",  # the route's model is not in the pool
    "unknown_primitive",  # the route's skill is not in the vocabulary
    "inadmissible_primitive",  # the model does not admit the skill
)

_NAMES = "|".join(TAGS)
# Possessive quantifiers (*+) throughout: the text is a model's or a worker's, and a backtracking
# pattern would take quadratic time on a '<' followed by thousands of spaces.
RESERVED_TOKEN = re.compile(rf"<\s*+/?\s*+(?:{_NAMES})(?=[\s/>]|$)", re.IGNORECASE)
_TAG_HEAD = re.compile(r"<\s*+(/?)\s*+([A-Za-z_][A-Za-z0-9_]*+)")
_TAG_END = re.compile(r"[<>]")
ATTRIBUTE_PATTERN = re.compile(r"""\s*+([A-Za-z_][\w-]*+)\s*+=\s*+(?:"([^"]*+)"|'([^']*+)')""")
_ENTITY = re.compile(r"&(lt|gt|amp);")
_ENTITY_TEXT = {"lt": "<", "gt": ">", "amp": "&"}
_INTEGER = re.compile(r"^\d{1,9}$")
_WHITESPACE = re.compile(r"\s*")
_ATTRIBUTES = {"plan": ("round",), "subtask": ("id", "depends_on"), "route": ("subtask", "model", "skill"),
               "verify": (), "final_answer": (), "replan": (), "obs": ("subtask",), "error": ("kind",)}


# ---------------------------------------------------------------- typed turns


@dataclass(frozen=True)
class Subtask:
    """A node of the plan's DAG with its route (A.7): what to do, on which (model, primitive)."""

    id: int
    description: str  # the <subtask> body: what the node is for
    depends_on: tuple[int, ...]
    model: str  # as the controller wrote it (a worker name, or its anonymous label)
    primitive: str
    instruction: str  # the <route> body: the only text the worker sees besides its dependencies' outputs


@dataclass(frozen=True)
class Plan:
    round: int
    subtasks: tuple[Subtask, ...]  # in declaration order; ids increase along every dependency


@dataclass(frozen=True)
class Verify:
    text: str
    replan: bool  # <replan/> given: verification failed, the plan that follows repairs


@dataclass(frozen=True)
class FinalAnswer:
    text: str


@dataclass(frozen=True)
class Turn:
    """One well-formed controller turn: an optional <verify>, then a plan or the final answer."""

    action: Plan | FinalAnswer
    verify: Verify | None = None

    @property
    def is_repair(self) -> bool:
        """A plan opened after verification failed (Fig. 6, decomp_repair)."""
        return isinstance(self.action, Plan) and self.verify is not None and self.verify.replan


@dataclass(frozen=True)
class GrammarError:
    kind: str  # one of ERROR_KINDS
    message: str

    @property
    def rule(self) -> str:
        """The name a turn row's `errors` records."""
        return f"grammar/{self.kind}"


@dataclass(frozen=True)
class RouteTable:
    """What a <route> may name: each model label with the primitives it admits, and the vocabulary."""

    models: Mapping[str, tuple[str, ...]]
    primitives: frozenset[str]


@dataclass(frozen=True)
class TurnContext:
    """What the parser must know of the episode so far."""

    routes: RouteTable
    last_round: int = 0  # round of the latest executed plan; 0 before any (then <verify> is misplaced)
    used_ids: frozenset[int] = frozenset()  # subtask ids of earlier rounds


@dataclass(frozen=True)
class TagSyntax:
    """A tag as written, before its name and attributes are checked."""

    closing: bool
    name: str
    raw_attributes: str
    self_closing: bool
    start: int
    end: int


def read_tag(text: str, pos: int) -> TagSyntax | None:
    """The tag that starts at `pos`, or None when no '>' comes before the next '<' (or the end)."""
    head = _TAG_HEAD.match(text, pos)
    stop = _TAG_END.search(text, pos + 1)
    if head is None or stop is None or text[stop.start()] == "<":
        return None
    inner = text[head.end():stop.start()].rstrip()
    self_closing = inner.endswith("/")
    return TagSyntax(bool(head.group(1)), head.group(2), inner[:-1] if self_closing else inner, self_closing,
                     pos, stop.end())


class _Malformed(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.error = GrammarError(kind, message)


# ---------------------------------------------------------------- escaping


def escape_text(text: str) -> str:
    """`text` with no reserved tag token left; `unescape_text` gives it back exactly."""
    protected = _ENTITY.sub(lambda m: "&amp;" + m.group(0)[1:], text)
    return RESERVED_TOKEN.sub(lambda m: "&lt;" + m.group(0)[1:], protected)


def unescape_text(text: str) -> str:
    return _ENTITY.sub(lambda m: _ENTITY_TEXT[m.group(1)], text)


# ---------------------------------------------------------------- parsing


def parse_turn(text: str, context: TurnContext) -> Turn | GrammarError:
    """The typed turn, or the first reason it is malformed."""
    try:
        return _TurnParser(text, context).parse()
    except _Malformed as bad:
        return bad.error


@dataclass
class _Tag:
    name: str
    closing: bool
    self_closing: bool
    attributes: dict[str, str]
    start: int
    end: int


class _TurnParser:
    def __init__(self, text: str, context: TurnContext):
        self.text = text
        self.context = context
        self.pos = 0

    # ------------------------------------------------ top level: the order of blocks

    def parse(self) -> Turn:
        if not self.text.strip():
            raise _Malformed("empty", "the turn is empty: write a <final_answer> or a <plan>")
        verify: Verify | None = None
        plan_tag, nodes, routes, answer = None, None, [], None
        for tag in self._top_level_blocks():
            if tag.name == "verify":
                if verify is not None:
                    raise _Malformed("duplicate_block", "one <verify> per turn")
                if plan_tag or answer is not None:
                    raise _Malformed("misplaced_block", "<verify> opens the turn, before the plan or the answer")
                if self.context.last_round == 0:
                    raise _Malformed("misplaced_block", "<verify> checks observations; there are none yet")
                verify = self._verify_body(tag)
            elif tag.name == "final_answer":
                if answer is not None:
                    raise _Malformed("duplicate_block", "exactly one <final_answer> (F.1)")
                if plan_tag:
                    raise _Malformed("misplaced_block", "a <final_answer> cannot share a turn with a <plan>: "
                                                        "wait for the observations")
                answer = self._text_body(tag, "the final answer")
            elif tag.name == "plan":
                if plan_tag:
                    raise _Malformed("duplicate_block", "one <plan> per turn")
                if answer is not None:
                    raise _Malformed("misplaced_block", "nothing may follow the <final_answer>")
                plan_tag, nodes = tag, self._plan_body(tag)
            else:  # route
                if not plan_tag:
                    raise _Malformed("misplaced_block", "a <route> follows the <plan> that declares its subtask")
                routes.append(self._route(tag))
        if answer is not None:
            if verify is not None and verify.replan:
                raise _Malformed("replan_conflict", "<replan/> says verification failed: open a new <plan>, "
                                                    "not a <final_answer>")
            return Turn(FinalAnswer(answer), verify)
        if plan_tag is None:
            raise _Malformed("missing_action", "after <verify>, write a <final_answer> or a new <plan>")
        return Turn(self._plan(plan_tag, nodes, routes), verify)

    def _top_level_blocks(self):
        """Yield each top-level opening tag; its body is consumed by the caller before the next."""
        while True:
            self.pos = _WHITESPACE.match(self.text, self.pos).end()
            if self.pos >= len(self.text):
                return
            if not RESERVED_TOKEN.match(self.text, self.pos):
                self._reject_text()
            tag = self._tag_at(self.pos)
            if tag.name in ENVIRONMENT_TAGS:
                raise _Malformed("environment_tag", f"<{tag.name}> is written by the executor, never by you")
            if tag.closing:
                raise _Malformed("unmatched_close", f"</{tag.name}> closes no open block")
            if tag.name not in ("plan", "route", "verify", "final_answer"):
                raise _Malformed("misplaced_block", f"<{tag.name}> belongs inside a "
                                                    f"{'<plan>' if tag.name == 'subtask' else '<verify>'}")
            self.pos = tag.end
            yield tag

    def _reject_text(self) -> None:
        rest = self.text[self.pos:]
        head = _TAG_HEAD.match(rest)
        if head:
            name = head.group(2)
            raise _Malformed("unknown_tag", f"<{name}> is not a tag of the grammar ({', '.join(TAGS[:6])})")
        if self.pos > 0 and not RESERVED_TOKEN.search(self.text, self.pos):
            raise _Malformed("trailing_text", f"text after the last block: {_clip(rest)!r}")
        raise _Malformed("stray_text", f"text outside the blocks: {_clip(rest)!r}")

    # ------------------------------------------------ tags and bodies

    def _tag_at(self, pos: int) -> _Tag:
        tag = read_tag(self.text, pos)
        if tag is None:
            raise _Malformed("malformed_tag", f"tag at offset {pos} is not closed with '>': "
                                              f"{_clip(self.text[pos:])!r}")
        closing, name, raw_attributes, self_closing = tag.closing, tag.name, tag.raw_attributes, tag.self_closing
        if name not in TAGS:
            raise _Malformed("unknown_tag", f"<{name}>: tags are lower-case ({', '.join(TAGS[:6])})")
        if closing and (raw_attributes.strip() or self_closing):
            raise _Malformed("malformed_tag", f"</{name}> takes no attributes")
        if bool(self_closing) != (name == "replan") and not closing:
            raise _Malformed("malformed_tag", "<replan/> is self-closing" if name == "replan"
                             else f"<{name}> is a block with a closing </{name}>, not self-closing")
        attributes = {} if closing else _attributes(name, raw_attributes)
        return _Tag(name, closing, self_closing, attributes, tag.start, tag.end)

    def _body(self, tag: _Tag, allow_replan: bool = False) -> tuple[str, int]:
        """Text up to the block's closing tag, and how many <replan/> it held."""
        replans, start = 0, self.pos
        pieces, piece_start = [], start
        while True:
            found = RESERVED_TOKEN.search(self.text, self.pos)
            if found is None:
                raise _Malformed("unclosed_tag", f"<{tag.name}> is never closed (truncated?)")
            inner = self._tag_at(found.start())
            if inner.closing and inner.name == tag.name:
                pieces.append(self.text[piece_start:inner.start])
                self.pos = inner.end
                return "".join(pieces), replans
            if inner.name in ENVIRONMENT_TAGS:
                raise _Malformed("environment_tag", f"<{inner.name}> is written by the executor, never by you")
            if inner.closing:
                raise _Malformed("unclosed_tag", f"<{tag.name}> is not closed before </{inner.name}>")
            if not (allow_replan and inner.name == "replan"):
                raise _Malformed("nested_tag", f"<{inner.name}> inside <{tag.name}>")
            replans += 1
            pieces.append(self.text[piece_start:inner.start])
            piece_start = self.pos = inner.end

    def _text_body(self, tag: _Tag, what: str) -> str:
        body, _ = self._body(tag)
        text = unescape_text(body).strip()
        if not text:
            raise _Malformed("empty", f"{what} is empty")
        return text

    def _verify_body(self, tag: _Tag) -> Verify:
        body, replans = self._body(tag, allow_replan=True)
        if replans > 1:
            raise _Malformed("duplicate_block", "one <replan/> per <verify>")
        return Verify(unescape_text(body).strip(), replans == 1)

    def _plan_body(self, tag: _Tag) -> list[tuple[_Tag, str]]:
        """The plan's (subtask tag, description) pairs, up to </plan>."""
        nodes = []
        while True:
            self.pos = _WHITESPACE.match(self.text, self.pos).end()
            if self.pos >= len(self.text):
                raise _Malformed("unclosed_tag", "<plan> is never closed (truncated?)")
            if not RESERVED_TOKEN.match(self.text, self.pos):
                raise _Malformed("stray_text", f"a <plan> holds only <subtask> blocks: {_clip(self.text[self.pos:])!r}")
            inner = self._tag_at(self.pos)
            self.pos = inner.end
            if inner.closing and inner.name == "plan":
                return nodes
            if inner.name in ENVIRONMENT_TAGS:
                raise _Malformed("environment_tag", f"<{inner.name}> is written by the executor, never by you")
            if inner.closing:
                raise _Malformed("unclosed_tag", f"<plan> is not closed before </{inner.name}>")
            if inner.name != "subtask":
                raise _Malformed("nested_tag", f"<{inner.name}> inside <plan>: routes follow </plan>")
            nodes.append((inner, self._text_body(inner, f"subtask {inner.attributes['id']}'s description")))

    def _route(self, tag: _Tag) -> tuple[_Tag, str]:
        return tag, self._text_body(tag, f"the instruction of the route for subtask {tag.attributes['subtask']}")

    # ------------------------------------------------ the plan's meaning

    def _plan(self, tag: _Tag, nodes: list[tuple[_Tag, str]], routes: list[tuple[_Tag, str]]) -> Plan:
        round_ = _integer(tag, "round")
        if round_ != self.context.last_round + 1:
            raise _Malformed("bad_round", f"round {round_}: the next round is {self.context.last_round + 1}")
        if not nodes:
            raise _Malformed("empty", "the plan declares no subtask")
        declared = self._declared(nodes)
        by_id = self._routes_by_id(routes, declared)
        subtasks = []
        for (node, description), (k, deps) in zip(nodes, declared.items()):
            if k not in by_id:
                raise _Malformed("missing_route", f"subtask {k} has no <route>")
            route, instruction = by_id[k]
            model, primitive = route.attributes["model"], route.attributes["skill"]
            self._check_pair(model, primitive)
            subtasks.append(Subtask(k, description, deps, model, primitive, instruction))
        return Plan(round_, tuple(subtasks))

    def _declared(self, nodes: list[tuple[_Tag, str]]) -> dict[int, tuple[int, ...]]:
        """Subtask id -> its dependencies, checked against F.1's rules (unique ids, j < k for j in deps)."""
        declared: dict[int, tuple[int, ...]] = {}
        for node, _ in nodes:
            k = _integer(node, "id")
            if k in declared or k in self.context.used_ids:
                raise _Malformed("duplicate_id", f"subtask id {k} is already used")
            deps = _id_list(node)
            for j in deps:
                if j >= k:
                    raise _Malformed("cycle", f"subtask {k} depends on {j}: an id must exceed every id it "
                                              "depends on (F.1), which keeps the plan acyclic")
                if j not in declared and j not in self.context.used_ids:
                    raise _Malformed("unknown_dependency", f"subtask {k} depends on {j}, which no round declared")
            declared[k] = deps
        return declared

    def _routes_by_id(self, routes: list[tuple[_Tag, str]], declared: dict) -> dict[int, tuple[_Tag, str]]:
        by_id: dict[int, tuple[_Tag, str]] = {}
        for route, instruction in routes:
            k = _integer(route, "subtask")
            if k not in declared:
                raise _Malformed("orphan_route", f"<route subtask=\"{k}\"> names no subtask of this plan")
            if k in by_id:
                raise _Malformed("duplicate_route", f"subtask {k} has two <route> blocks")
            by_id[k] = (route, instruction)
        return by_id

    def _check_pair(self, model: str, primitive: str) -> None:
        routes = self.context.routes
        if model not in routes.models:
            raise _Malformed("unknown_model", f"model {model!r} is not in the pool ({', '.join(routes.models)})")
        if primitive not in routes.primitives:
            raise _Malformed("unknown_primitive", f"skill {primitive!r} is not a primitive "
                                                  f"({', '.join(sorted(routes.primitives))})")
        if primitive not in routes.models[model]:
            raise _Malformed("inadmissible_primitive", f"{model} does not admit {primitive!r} "
                                                       f"(it admits {', '.join(routes.models[model])})")


def _attributes(name: str, raw: str) -> dict[str, str]:
    """The tag's attributes: exactly the ones the grammar gives `name`, each once, quoted."""
    found: dict[str, str] = {}
    pos, end = 0, len(raw.rstrip())
    while pos < end:
        match = ATTRIBUTE_PATTERN.match(raw, pos)
        if match is None:
            raise _Malformed("bad_attribute", f"<{name}>: cannot read attributes {raw.strip()!r} "
                                              "(write key=\"value\")")
        key = match.group(1)
        if key not in _ATTRIBUTES[name]:
            raise _Malformed("bad_attribute", f"<{name}> has no attribute {key!r}")
        if key in found:
            raise _Malformed("bad_attribute", f"<{name}>: attribute {key!r} given twice")
        found[key] = match.group(2) if match.group(2) is not None else match.group(3)
        pos = match.end()
    missing = [k for k in _ATTRIBUTES[name] if k not in found]
    if missing:
        raise _Malformed("bad_attribute", f"<{name}> needs attribute {missing[0]!r}")
    return found


def _integer(tag: _Tag, key: str) -> int:
    value = tag.attributes[key].strip()
    if not _INTEGER.match(value):
        raise _Malformed("bad_attribute", f"<{tag.name}> {key}={value!r} is not a non-negative integer")
    return int(value)


def _id_list(tag: _Tag) -> tuple[int, ...]:
    raw = tag.attributes["depends_on"].strip()
    if not raw:
        return ()
    items = [item.strip() for item in raw.split(",")]
    if not all(_INTEGER.match(item) for item in items):
        raise _Malformed("bad_attribute", f"<subtask> depends_on={raw!r}: comma-separated subtask ids")
    if len(set(items)) != len(items):
        raise _Malformed("bad_attribute", f"<subtask> depends_on={raw!r} repeats an id")
    return tuple(int(item) for item in items)


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
