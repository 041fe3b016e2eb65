"""Math answer grading with slime's names and rules (`rm_type` "math", "deepscaler", "boxed_*").

Two tests, either one suffices (`grade_answer_verl`):
- `grade_answer_mathd`: Hendrycks' MATH normalization (`\\dfrac`->`\\frac`, `\\frac12`, `a/b`,
  `0.5`, degrees, `\\%`, units after `\\text{ `, `k=`), then string equality;
- `grade_answer_sympy`: a looser normalization (units, `$`, `%`, `\\text{}`, thousands commas,
  case), then, element by element for tuples, symbolic equivalence decided by math-verify
  (`symbolic.SymbolicChecker`, bounded by a deadline). slime's deliberate refusals are kept:
  two integer fractions must be written the same (`2/4` is not `1/2`), an integer ground truth
  needs an integer answer, and text of more than two letters is not read as a product of symbols.
"""

from __future__ import annotations

import re
import unicodedata

from slime.utils.math_grading.braces import closing_brace, last_boxed
from slime.utils.math_grading.symbolic import SymbolicChecker, default_checker

__all__ = [
    "mathd_normalize_answer",
    "grade_answer_mathd",
    "grade_answer_sympy",
    "grade_answer_verl",
    "last_boxed_only_string",
    "remove_boxed",
    "extract_boxed_answer",
    "extract_answer",
    "split_tuple",
    "should_allow_eval",
    "are_equal_under_sympy",
    "count_unknown_letters_in_expr",
]

# ---------------------------------------------------------------- extraction


def last_boxed_only_string(string: str) -> str | None:
    """The last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, wrapper included."""
    return last_boxed(string, "\\boxed", "\\fbox")


def remove_boxed(s: str | None) -> str | None:
    """`\\boxed{x}` -> `x`; None for anything else (this module's variant never raises)."""
    if isinstance(s, str) and s.startswith("\\boxed{") and s.endswith("}"):
        return s[len("\\boxed{") : -1]
    return None


def extract_boxed_answer(solution: str) -> str | None:
    return remove_boxed(last_boxed_only_string(solution))


def extract_answer(passage: str) -> str | None:
    """The boxed answer of a passage, or None when it has no `\\boxed`."""
    return extract_boxed_answer(passage) if "\\boxed" in passage else None


# ---------------------------------------------------------------- mathd (Hendrycks) normalization


def _expand_frac_shorthand(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{7}` -> `\\frac{1}{7}`; unchanged if malformed."""
    head, *parts = s.split("\\frac")
    out = [head]
    for part in parts:
        out.append("\\frac")
        if part.startswith("{"):
            out.append(part)
        elif len(part) < 2:
            return s
        elif part[1] == "{":
            out.append("{" + part[0] + "}" + part[1:])
        else:
            out.append("{" + part[0] + "}{" + part[1] + "}" + part[2:])
    return "".join(out)


def _slash_to_frac(s: str) -> str:
    """`3/4` -> `\\frac{3}{4}` when both sides are plain integers."""
    m = re.fullmatch(r"(-?\d+)/(-?\d+)", s)
    if m and s == f"{int(m.group(1))}/{int(m.group(2))}":
        return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    return s


def _expand_sqrt_shorthand(s: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}`; raises IndexError on a trailing `\\sqrt` (caller keeps input)."""
    head, *parts = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:]) for p in parts)


def _strip_string(string: str) -> str:
    s = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:  # "\text{ " introduces units on the right
        value, unit = s.split("\\text{ ")  # more than one: ValueError, the caller keeps the input
        s = value
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs) <= 2:  # "k = 3" -> "3"
        s = rhs
    s = _expand_sqrt_shorthand(s).replace(" ", "")
    s = _expand_frac_shorthand(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def mathd_normalize_answer(answer: str | None) -> str | None:
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = re.fullmatch(r"\\text\{(.+?)\}", answer)
        if m:
            answer = m.group(1).strip()
        return _strip_string(answer)
    except (ValueError, IndexError):
        return answer


def grade_answer_mathd(given_answer: str, ground_truth: str) -> bool:
    return mathd_normalize_answer(ground_truth) == mathd_normalize_answer(given_answer)


# ---------------------------------------------------------------- looser normalization


_UNITS = (
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
)
_UNIT_RE = re.compile("|".join(rf"{u}(es)?(s)? *(\^[0-9]+)?" for u in _UNITS))
_TUPLE_CHARS = "()[]"
_TEXT_MACROS = (
    "text",
    "textbf",
    "textit",
    "mathrm",
    "mathbf",
    "mathit",
    "mathsf",
    "mathcal",
    "mathbb",
    "operatorname",
    "emph",
    "overline",
    "hbox",
    "mbox",
)
_SYMBOLS = {
    "pi": "pi",
    "infty": "inf",
    "cdot": "*",
    "times": "*",
    "div": "/",
    "pm": "±",
    "mp": "∓",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "ne": "≠",
    "neq": "≠",
    "lt": "<",
    "gt": ">",
    "cup": "U",
    "cap": "∩",
    "in": "∈",
    "circ": "∘",
    "dots": "…",
    "ldots": "…",
    "cdots": "⋯",
    "quad": " ",
    "qquad": " ",
    ",": " ",
    ";": " ",
    ":": " ",
    " ": " ",
    "{": "{",
    "}": "}",
    "%": "%",
    "$": "$",
    "&": "&",
    "#": "#",
    "_": "_",
}


def _braced(s: str, i: int) -> tuple[str, int] | None:
    """The `{...}` group starting at s[i] (content, index after it), or None."""
    if i >= len(s) or s[i] != "{":
        return None
    end = closing_brace(s, i)
    return None if end is None else (s[i + 1 : end], end + 1)


def _arg(s: str, i: int) -> tuple[str, int]:
    """A macro argument at s[i]: a braced group or a single character (spaces skipped)."""
    while i < len(s) and s[i] == " ":
        i += 1
    g = _braced(s, i)
    if g is not None:
        return g
    return (s[i], i + 1) if i < len(s) else ("", i)


def _simple(x: str) -> bool:
    return bool(re.fullmatch(r"-?[\w.]+|\(.*\)", x))


def latex_to_plain(s: str) -> str:
    """LaTeX to plain math text (`\\frac{a}{b}` -> `a/b`, `\\sqrt{2}` -> `sqrt(2)`, `\\pi` -> `pi`,
    `\\text{cm}` -> `cm`); only used for the string comparison and guards around math-verify."""
    out: list[str] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        m = re.match(r"\\([A-Za-z]+|.)", s[i:])
        if not m:
            i += 1
            continue
        name, i = m.group(1), i + m.end()
        if name in ("frac", "dfrac", "tfrac", "cfrac"):
            num, i = _arg(s, i)
            den, i = _arg(s, i)
            num, den = latex_to_plain(num), latex_to_plain(den)
            num = num if _simple(num) else f"({num})"
            den = den if _simple(den) else f"({den})"
            rest = s[i:].lstrip()
            if rest[:1].isalpha() or rest[:1] in ("\\", "("):  # \frac12\sqrt3: (1/2)sqrt(3), not 1/2sqrt(3)
                out.append(f" ({num}/{den})")
            else:
                out.append(f" {num}/{den}")  # the space keeps "7\frac34" a mixed number
        elif name == "sqrt":
            index = None
            if i < len(s) and s[i] == "[":
                close = s.find("]", i)
                if close > 0:
                    index, i = s[i + 1 : close], close + 1
            body, i = _arg(s, i)
            body = latex_to_plain(body)
            out.append(f"root({body},{latex_to_plain(index)})" if index else f"sqrt({body})")
        elif name in _TEXT_MACROS:
            body, i = _arg(s, i)
            out.append(latex_to_plain(body))
        elif name in ("left", "right", "big", "Big", "bigg", "Bigg", "displaystyle", "!"):
            continue
        elif name in _SYMBOLS:
            out.append(_SYMBOLS[name])
        else:
            try:  # Greek letters become their own character, as one unknown each
                out.append(
                    unicodedata.lookup(f"GREEK {'CAPITAL' if name[0].isupper() else 'SMALL'} LETTER {name.upper()}")
                )
            except KeyError:
                out.append(name)  # \sin, \ln, \log ...
    return "".join(out)


def _is_float(x: str) -> bool:
    try:
        float(x)
        return True
    except ValueError:
        return False


def _strip_thousands(expr: str) -> str:
    """1,234,567 -> 1234567, leaving tuple commas such as (1,23) alone."""
    while True:
        new = re.sub(r"(\d),(\d\d\d)($|\D)", r"\1\2\3", expr)
        if new == expr:
            return new
        expr = new


def _str_is_int(x: str) -> bool:
    try:
        v = float(_strip_thousands(x))
        return abs(v - round(v)) <= 1e-7
    except (ValueError, OverflowError):
        return False


def _is_frac(expr: str) -> bool:
    return bool(re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr))


def _clean_text(expr: str) -> str:
    """The removals both sides share before any math: `\\text{}` wrapper, `$`, `%`, number words,
    units, degrees, thousands separators written `,\\!`."""
    m = re.fullmatch(r"\\text\{(.+?)\}", expr)
    if m:
        expr = m.group(1)
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    expr = _UNIT_RE.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    return re.sub(r",\\! *", "", expr)


def _normalize(expr: str | None) -> str | None:
    if expr is None:
        return None
    expr = _clean_text(expr)
    if _is_float(expr) and _str_is_int(expr):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        expr = latex_to_plain(expr)
    expr = re.sub(r"- *", "-", expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", expr)  # mixed number "7 3/4"
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(_strip_thousands(expr))))
    return expr


def count_unknown_letters_in_expr(expr: str) -> int:
    expr = expr.replace("sqrt", "").replace("frac", "").replace("root", "")
    return len({c for c in expr if c.isalpha()})


def should_allow_eval(expr: str) -> bool:
    """Text (more than two distinct letters) is compared as text, never as a product of symbols."""
    return count_unknown_letters_in_expr(expr) <= 2


def split_tuple(expr: str) -> list[str]:
    """`(1,2)` / `[1,2)` -> its elements (thousands commas kept inside numbers); else `[expr]`."""
    expr = _strip_thousands(expr)
    if not expr:
        return []
    if (
        len(expr) > 2
        and expr[0] in _TUPLE_CHARS
        and expr[-1] in _TUPLE_CHARS
        and not any(c in _TUPLE_CHARS for c in expr[1:-1])
    ):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def are_equal_under_sympy(
    ground_truth_normalized: str, given_normalized: str, checker: SymbolicChecker | None = None
) -> bool:
    """Symbolic equivalence (math-verify, bounded) of two normalized answers."""
    if not should_allow_eval(f"({ground_truth_normalized})-({given_normalized})"):
        return False
    return (checker or default_checker()).equivalent(ground_truth_normalized, given_normalized)


def grade_answer_sympy(given_answer: str, ground_truth: str, checker: SymbolicChecker | None = None) -> bool:
    truth = _normalize(ground_truth)
    given = _normalize(given_answer)
    if truth is None or given is None:
        return False
    if truth == given:
        return True
    if not given:
        return False
    truth_elems, given_elems = split_tuple(truth), split_tuple(given)
    if len(truth_elems) > 1 and (truth[0] != given[0] or truth[-1] != given[-1]):
        return False  # (a,b) is not [a,b]
    if len(truth_elems) != len(given_elems):
        return False
    symbolic = []
    for t, g in zip(truth_elems, given_elems):
        if t == g:
            continue
        if _is_frac(t) and _is_frac(g):
            return False  # unreduced fractions must be written as the ground truth writes them
        if _str_is_int(t) != _str_is_int(g):
            return False  # an integer answer is matched exactly
        if not should_allow_eval(f"({t})-({g})"):
            return False
        if "," in t or "," in g:
            return False  # an unbracketed list is not read as a set: "1, 2" is not "2, 1"
        symbolic.append((t, g))
    checker = checker or default_checker()
    return all(checker.equivalent(t, g) for t, g in symbolic)


def grade_answer_verl(solution_str: str, ground_truth) -> bool:
    """The boxed answer of `solution_str` against `ground_truth` (boxed or bare)."""
    if not ground_truth:
        return False
    truth = str(ground_truth)
    if "\\boxed" in truth:
        truth = extract_answer(truth)
        if truth is None:
            return False
    given = extract_answer(solution_str)
    if given is None:
        return False
    return grade_answer_mathd(given, truth) or grade_answer_sympy(given, truth)
