"""What a GSM8K draft shows about its own correctness without a model: whether it ends in an answer
line and whether its last `<<a=b>>` calculator annotation is wrong. The features
experiments/critique_draft_signal.py scores and experiments/critique_verdict_probe.py reads a
controller's verdict against."""

from __future__ import annotations

import ast
import operator
import re

ANSWER_LINE = re.compile(r"####\s*\S+\s*$")
ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def arithmetic(expression: str) -> float:
    """The value of a +−×÷^ expression of numbers (ast-walked; no eval); ValueError otherwise."""
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.operand))
        raise ValueError(expression)
    try:
        return walk(ast.parse(expression.replace("^", "**").replace(",", ""), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, OverflowError) as err:
        raise ValueError(expression) from err


def wrong_last_annotation(draft: str) -> bool:
    """The last `<<a=b>>` of the draft does not compute (or cannot be read)."""
    found = ANNOTATION.findall(draft)
    if not found:
        return False
    lhs, rhs = found[-1]
    try:
        return abs(arithmetic(lhs) - float(rhs.replace(",", ""))) > 1e-6 * max(1.0, abs(float(rhs.replace(",", ""))))
    except ValueError:
        return True


def visible_features(draft: str) -> dict[str, float]:
    return {"no_answer_line": float(not ANSWER_LINE.search(draft.strip())),
            "wrong_last_annotation": float(wrong_last_annotation(draft)),
            "words_per_100": len(draft.split()) / 100.0}
