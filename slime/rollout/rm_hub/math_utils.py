"""slime's path for the math answer graders (`rm_type` "math", "deepscaler", "boxed_*"); the code lives in
`slime.utils.math_grading.answers` (tools grade math answers too, and sit below rollout). Every name the
module had is re-exported, private helpers included (slime's own tests import `_strip_string`)."""

from __future__ import annotations

from slime.utils.math_grading.answers import (  # noqa: F401 - re-exports
    _SYMBOLS,
    _TEXT_MACROS,
    _TUPLE_CHARS,
    _UNIT_RE,
    _UNITS,
    SymbolicChecker,
    __all__,
    _arg,
    _braced,
    _clean_text,
    _expand_frac_shorthand,
    _expand_sqrt_shorthand,
    _is_float,
    _is_frac,
    _normalize,
    _simple,
    _slash_to_frac,
    _str_is_int,
    _strip_string,
    _strip_thousands,
    are_equal_under_sympy,
    closing_brace,
    count_unknown_letters_in_expr,
    default_checker,
    extract_answer,
    extract_boxed_answer,
    grade_answer_mathd,
    grade_answer_sympy,
    grade_answer_verl,
    last_boxed,
    last_boxed_only_string,
    latex_to_plain,
    mathd_normalize_answer,
    remove_boxed,
    should_allow_eval,
    split_tuple,
)
