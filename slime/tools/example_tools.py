"""A stateless example tool: a safe arithmetic calculator.

Stateless tools need no per-instance bookkeeping: `create`/`release` from BaseTool are enough,
and `execute` depends only on its parameters. Expressions are evaluated on a whitelisted AST
(numbers and + - * / // % **, with bounded exponents), never with `eval`.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from slime.tools.base_tool import BaseTool
from slime.tools.schemas import ToolResponse

_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def safe_eval(expression: str, max_len: int = 200) -> float | int:
    if len(expression) > max_len:
        raise ValueError(f"expression longer than {max_len} characters")
    return _eval(ast.parse(expression, mode="eval").body)


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise ValueError("exponent or base too large")
        return _BIN[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


class CalculatorTool(BaseTool):
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        expr = str(parameters.get("expression", ""))
        try:
            value = safe_eval(expr)
        except ZeroDivisionError:
            return ToolResponse(text="error: division by zero"), 0.0, {"ok": 0}
        except (ValueError, SyntaxError) as e:
            return ToolResponse(text=f"error: cannot evaluate {expr!r}: {e}"), 0.0, {"ok": 0}
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return ToolResponse(text=str(value)), 0.0, {"ok": 1}
