"""The helpers' two-stage parse (issue 47, item 5): SLL prediction first, math_verify's own LL on a syntax error,
gives the parse LL alone gives, on the strings the reward sends to math_verify."""

from __future__ import annotations

import logging

import pytest
from test_reward import load_reward

from llm_rl.qwen2_5 import reward_cases
from llm_rl.qwen2_5.bench_reward import FRESH_PATH, policy_workload


@pytest.fixture(scope="module")
def reward():
    return load_reward()


def test_two_stage_parsing_gives_what_ll_parsing_gives(reward):
    logging.disable(logging.WARNING)
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy

    class TwoStage(_Latex2Sympy):  # the helpers change latex2sympy2_extended's class; here a copy of it
        pass

    assert reward._two_stage_parsing(TwoStage)
    strings = []
    for response, truth, _ in policy_workload(0.0, 0, FRESH_PATH)[::3]:
        prep = reward._prepare(response, truth)
        if prep.answer is not None:
            strings += [*prep.gold.sane, reward._for_sympy(prep.answer.text)]
    strings += [s for _, a, t in reward_cases.generated_pairs(100, 13) for s in (a, t)]
    strings += [
        "x \\le 3",
        "\\{1, 2\\}",
        "(-\\infty, 2) \\cup (3, \\infty)",
        "1 \\text{ or } 2",
        "\\frac{1}{",
        "3+",
    ]

    def parsed(cls, latex: str) -> str:
        try:
            return str(cls(is_real=True).parse(latex))
        except Exception as exc:  # noqa: BLE001 - a string LL cannot parse must fail the same way
            return f"error {type(exc).__name__}"

    strings = list(dict.fromkeys(strings))
    assert len(strings) > 150
    for latex in strings:
        assert parsed(TwoStage, latex) == parsed(_Latex2Sympy, latex), latex
    logging.disable(logging.NOTSET)
