"""Tool workers: a Python sandbox and a computer-algebra backend (sympy), priced per call.

Both return the tool's answer as text. A program that fails, or an expression that does not parse, is
an *answer* ("Error: ..." in the text, WorkerResult.error empty) that the router learns from; only a
tool that could not run at all (the sandbox failed to start, or cannot exist on this machine) sets
WorkerResult.error.
"""

from __future__ import annotations

import ast
import asyncio
import re
import time
from tokenize import TokenError

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    eval_expr,
    implicit_multiplication,
    standard_transformations,
    stringify_expr,
)

from routerops.pricing import WorkerSpec
from routerops.types import Payload, WorkerResult
from routerops.workers.concurrency import ConcurrencyLimit
from routerops.workers.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, run_python

_FENCE = re.compile(r"```[ \t]*(python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_STDERR_TAIL_CHARS = 2000


def payload_text(payload: Payload) -> str:
    """The text a tool works on: the payload itself, or the last user message of a chat payload."""
    if isinstance(payload, str):
        return payload
    for message in reversed(payload):
        if message.get("role") == "user":
            return message.get("content") or ""
    return payload[-1].get("content", "") if payload else ""


def extract_code(text: str) -> str:
    """The first ```python fenced block, else the first bare fenced block, else the whole text."""
    blocks = _FENCE.findall(text)
    tagged = [code for lang, code in blocks if lang]
    if tagged or blocks:
        return (tagged or [code for _, code in blocks])[0]
    return text


class PythonWorker:
    """Runs the code in the payload in the sandbox; its stdout is the answer."""

    def __init__(self, spec: WorkerSpec, limits: SandboxLimits | None = None):
        self.name = spec.name
        self.spec = spec
        # Half the call timeout as CPU: a CPU-bound program then reports cpu_time, a sleeping one wall_time.
        self.limits = limits or SandboxLimits(cpu_s=max(1, int(spec.timeout_s / 2)), wall_s=float(spec.timeout_s))
        self._slots = ConcurrencyLimit(spec.concurrency)

    async def call(self, payload: Payload, max_tokens: int | None = None) -> WorkerResult:
        code = extract_code(payload_text(payload))
        started = time.monotonic()
        async with self._slots:
            try:
                result = await asyncio.to_thread(run_python, code, self.limits)
            except SandboxUnavailable as exc:  # no isolation backend here: refuse, never run unsandboxed
                return WorkerResult(text="", latency_s=time.monotonic() - started, error=f"sandbox unavailable: {exc}")
            except OSError as exc:  # the sandbox itself could not start
                return WorkerResult(text="", latency_s=time.monotonic() - started, error=f"sandbox failed: {exc}")
        return WorkerResult(text=describe_run(result), latency_s=time.monotonic() - started)


def describe_run(result: SandboxResult) -> str:
    """stdout, followed by an 'Error: ...' line naming the limit or the exception when the run failed."""
    if result.limit:
        detail = f"the program was stopped by the sandbox {result.limit} limit"
    elif result.exit_code != 0:
        tail = result.stderr.strip()[-_STDERR_TAIL_CHARS:]
        detail = tail.splitlines()[-1] if tail else f"exit code {result.exit_code}"
    else:
        return result.stdout
    sep = "" if not result.stdout or result.stdout.endswith("\n") else "\n"
    return f"{result.stdout}{sep}Error: {detail}"


# ---------------------------------------------------------------------------------------------- sympy

MAX_EXPRESSION_CHARS = 2000
MAX_RESULT_DIGITS = 4000  # refuse powers with more digits (Python prints ints up to 4300 digits)
MAX_FACTORIAL_ARG = 1000  # 1000! has 2568 digits
_SYMPY_NAMES = (
    "Integer", "Float", "Rational", "Symbol", "pi", "E", "I", "oo", "nan", "zoo",
    "sqrt", "cbrt", "root", "exp", "log", "ln", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos",
    "atan", "atan2", "sinh", "cosh", "tanh", "Abs", "sign", "floor", "ceiling", "Mod", "Min", "Max",
    "factorial", "binomial", "gcd", "lcm", "isprime", "prime", "totient", "re", "im", "conjugate",
    "simplify", "expand", "factor", "cancel", "together", "apart", "diff", "integrate", "limit",
    "summation", "product", "solve", "Eq", "N", "nsimplify",
)
_SAFE_GLOBALS = {"__builtins__": {}, **{name: getattr(sympy, name) for name in _SYMPY_NAMES}}
# Implicit multiplication ("2x") but no symbol splitting: "hello" must fail, not become h*e*l**2*o.
_TRANSFORMATIONS = standard_transformations + (implicit_multiplication, convert_xor)
_HEAVY_OPERATIONS = (
    "simplify", "expand", "factor", "cancel", "together", "apart", "diff", "integrate", "limit",
    "summation", "product", "solve", "N", "nsimplify", "isprime", "prime", "totient", "gcd", "lcm",
)
# Stand-ins used for the size check: an undefined function keeps its arguments and computes nothing.
_INERT_OPERATIONS = {name: sympy.Function(name) for name in _HEAVY_OPERATIONS}
_SYMBOL_NAME = re.compile(
    r"^([A-Za-z](_?\d+)?|alpha|beta|gamma|delta|epsilon|zeta|eta|theta|iota|kappa|lambda|mu|nu|xi|"
    r"omicron|rho|sigma|tau|upsilon|phi|chi|psi|omega)$"
)
_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Load, ast.Constant, ast.Tuple,
    ast.List, ast.keyword, ast.operator, ast.unaryop, ast.Compare, ast.cmpop,
)


_LITERAL_TAKERS = ("Symbol", "Integer", "Float", "Rational")


class UnsafeExpression(ValueError):
    """The expression is not plain mathematics (attributes, subscripts, unknown functions...)."""


def parse_math(text: str) -> sympy.Basic:
    """Parse and evaluate `text` with sympy's parser, refusing anything but mathematics.

    sympy's parse_expr ends in eval(); so the code it would evaluate (stringify_expr) is first checked
    against a whitelist (calls only to known sympy names; no attributes, subscripts, lambdas, dunder
    names or string literals; symbols named like x, y1, alpha) and evaluated with empty builtins. It is
    first evaluated inert (evaluate=False, heavy operations as undefined functions) so that numbers too
    large to compute (9**9**9) are refused before anything computes them.
    """
    text = text.strip().strip("`").strip()
    if not text:
        raise ValueError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        code = stringify_expr(text, {}, dict(_SAFE_GLOBALS), _TRANSFORMATIONS)
    except (TokenError, SyntaxError) as exc:
        raise ValueError(f"could not parse {text[:80]!r} as a math expression") from exc
    _check_code(code)
    with sympy.evaluate(False):
        inert = eval_expr(code, {}, {**_SAFE_GLOBALS, **_INERT_OPERATIONS})
    _check_size(inert)
    return eval_expr(code, {}, dict(_SAFE_GLOBALS))


def _check_code(code: str) -> None:
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an expression: {exc.msg}") from exc
    # String literals only as the name of a Symbol or the digits of a number (the parser writes
    # those); anywhere else a string would reach sympify(), which parses and eval()s it unchecked.
    literal_args = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _LITERAL_TAKERS:
            literal_args.update({id(arg): node.func.id for arg in node.args})
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise UnsafeExpression(f"{type(node).__name__} is not allowed in a math expression")
        if isinstance(node, ast.Name) and node.id not in _SAFE_GLOBALS:
            raise UnsafeExpression(f"unknown name {node.id!r}")
        if isinstance(node, ast.Call) and not isinstance(node.func, ast.Name):
            raise UnsafeExpression("only calls to named functions are allowed")
        if isinstance(node, ast.Constant):
            _check_constant(node, literal_args.get(id(node)))


def _check_constant(node: ast.Constant, taker: str | None) -> None:
    if isinstance(node.value, bool) or not isinstance(node.value, (int, float, str)):
        raise UnsafeExpression(f"constant {node.value!r} is not allowed")
    if isinstance(node.value, str):
        if taker is None:
            raise UnsafeExpression("string literals are not allowed in a math expression")
        if taker == "Symbol" and not _SYMBOL_NAME.match(node.value):
            raise ValueError(f"unknown name {node.value!r} (variables are single letters or Greek letters)")


def _too_many_digits(base: sympy.Expr, exponent: sympy.Expr) -> bool:
    # |exponent| * log10|base| digits, computed with sympy Floats (no float overflow for 2**(10**400)).
    abs_base = sympy.Abs(base).evalf(8)
    if abs_base == 0 or abs_base == 1:
        return False
    digits = (sympy.Abs(exponent).evalf(8) * sympy.Abs(sympy.log(abs_base, 10)).evalf(8)).evalf(8)
    return bool(digits > MAX_RESULT_DIGITS)


def _check_size(expr: sympy.Basic) -> None:
    """Refuse numbers too large to compute (9**9**9, factorial(10**9)); children are checked first,
    so every number evalf() sees here has already been found small enough."""
    if not isinstance(expr, sympy.Basic):
        return
    for node in sympy.postorder_traversal(expr):
        is_number_power = isinstance(node, sympy.Pow) and node.base.is_number and node.exp.is_number
        if is_number_power and _too_many_digits(node.base, node.exp):
            raise ValueError(f"result too large: {node.base}**{node.exp} has over {MAX_RESULT_DIGITS} digits")
        is_number_factorial = isinstance(node, (sympy.factorial, sympy.binomial)) and node.args[0].is_number
        if is_number_factorial and bool(sympy.Abs(node.args[0]).evalf(8) > MAX_FACTORIAL_ARG):
            raise ValueError(f"result too large: {node.func.__name__} argument above {MAX_FACTORIAL_ARG}")


def evaluate_math(text: str) -> str:
    """Exact value when it is an integer or a rational, else a 15-digit numeric value; symbolic
    expressions are returned simplified."""
    expr = parse_math(text)
    if not isinstance(expr, sympy.Basic):  # solve() answers with a list
        return str(expr)
    exact = sympy.simplify(expr.doit())
    if exact.is_Rational or not exact.is_number:
        return str(exact)
    return str(sympy.N(exact, 15))


class SympyWorker:
    """Evaluates the payload as a math expression with sympy, in a worker thread with a timeout."""

    def __init__(self, spec: WorkerSpec):
        self.name = spec.name
        self.spec = spec
        self._slots = ConcurrencyLimit(spec.concurrency)

    async def call(self, payload: Payload, max_tokens: int | None = None) -> WorkerResult:
        text = payload_text(payload)
        started = time.monotonic()
        async with self._slots:
            try:
                answer = await asyncio.wait_for(asyncio.to_thread(evaluate_math, text), self.spec.timeout_s)
            except TimeoutError:
                # The thread cannot be killed; _check_size keeps known runaway inputs from getting here.
                answer = f"Error: sympy timed out after {self.spec.timeout_s:g}s"
            except (ValueError, TypeError, SyntaxError, ArithmeticError, sympy.SympifyError) as exc:
                answer = f"Error: {exc}"
            except Exception as exc:  # sympy raises many internal types for odd input
                answer = f"Error: {type(exc).__name__}: {exc}"
        return WorkerResult(text=answer, latency_s=time.monotonic() - started)
