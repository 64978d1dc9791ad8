"""The sympy tool's evaluator: parse a model-written expression, refuse what is not plain mathematics
or too large to compute, evaluate it. Imports only sympy and the standard library, so that it runs as
a script in a separate, resource-limited process (`python -I -B sympy_eval.py`; routerops/workers/
tool_process.py starts and kills it), never inside the pipeline's or the gateway's own process (issue
42 item 5: a thread cannot be killed, and `expand((x+y+z)**200)` kept a core busy after its timeout).

As a script it serves one JSON request per line on stdin ({"text": ...}) and answers one JSON line
on stdout ({"answer": ...}); before each request it sets its CPU limit to `cpu_s` more seconds.
"""

from __future__ import annotations

import ast
import json
import re
import resource
import sys
from tokenize import TokenError

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    eval_expr,
    implicit_multiplication,
    standard_transformations,
    stringify_expr,
)

MAX_EXPRESSION_CHARS = 2000
MAX_RESULT_DIGITS = 4000  # refuse powers with more digits (Python prints ints up to 4300 digits)
MAX_FACTORIAL_ARG = 1000  # 1000! has 2568 digits
MAX_NESTING = 50  # brackets inside brackets: deeper trees only exhaust sympy's recursion
MAX_PRECISION_DIGITS = 1000  # N(x, n): N(pi, 10**7) would compute ten million digits
# Integer arguments of number-theory functions whose cost grows with their size (factoring):
# totient(2**1001 + 1) factors a 302-digit number.
MAX_NUMBER_THEORY_ARG = {"totient": 10**24, "factor": 10**24, "prime": 10**7}
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


def _inert_n(expr, n=15, **options):
    """N as an undefined function that keeps its precision as an argument (a keyword `n` too)."""
    return sympy.Function("N")(expr, n)


_INERT_OPERATIONS["N"] = _inert_n
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
    if bracket_depth(text) > MAX_NESTING:
        raise ValueError(f"expression nested deeper than {MAX_NESTING} brackets")
    try:
        code = stringify_expr(text, {}, dict(_SAFE_GLOBALS), _TRANSFORMATIONS)
    except (TokenError, SyntaxError) as exc:
        raise ValueError(f"could not parse {text[:80]!r} as a math expression") from exc
    _check_code(code)
    with sympy.evaluate(False):
        inert = eval_expr(code, {}, {**_SAFE_GLOBALS, **_INERT_OPERATIONS})
    _check_size(inert)
    return eval_expr(code, {}, dict(_SAFE_GLOBALS))


def bracket_depth(text: str) -> int:
    """How deep (, [ and { nest in `text` (unbalanced text is the parser's to refuse)."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(depth - 1, 0)
    return deepest


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
        _check_cost(node)


def _above(value: sympy.Basic, bound: int) -> bool:
    return bool(value.is_number and sympy.Abs(value).evalf(8) > bound)


def _check_cost(node: sympy.Basic) -> None:
    """Refuse requests whose cost grows with a number in them: a precision (N(pi, 10**7)) or the
    integer a number-theory function must factor (totient(2**1001 + 1))."""
    name = getattr(node.func, "__name__", "")
    if name == "N" and len(node.args) > 1 and _above(node.args[1], MAX_PRECISION_DIGITS):
        raise ValueError(f"precision too large: N(..., {node.args[1]}) asks for over {MAX_PRECISION_DIGITS} digits")
    bound = MAX_NUMBER_THEORY_ARG.get(name)
    if bound is not None and node.args and _above(node.args[0], bound):
        raise ValueError(f"argument too large: {name}() of a number above {bound:.0e} is refused")


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




def _answer(text: str) -> str:
    """The tool's answer to one request: the value, or "Error: ..." for input it refuses."""
    try:
        return evaluate_math(text)
    except (ValueError, TypeError, SyntaxError, ArithmeticError, sympy.SympifyError) as exc:
        return f"Error: {exc}"
    except MemoryError:
        raise  # the parent names the memory limit when this process dies of it
    except Exception as exc:  # noqa: BLE001 - sympy raises many internal types for odd input
        return f"Error: {type(exc).__name__}: {exc}"


def serve(cpu_s: int) -> None:
    """One request per line: the CPU limit is reset to `cpu_s` seconds beyond what this process has
    used, so every request gets the same CPU allowance however many came before (RLIMIT_CPU counts
    the process's whole life); SIGXCPU ends the process, and the parent starts a fresh one. The first
    line says it is ready: a request's time starts once sympy is imported."""
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime) + 1 + cpu_s
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        answer = _answer(json.loads(line)["text"])
        sys.stdout.write(json.dumps({"answer": answer}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
