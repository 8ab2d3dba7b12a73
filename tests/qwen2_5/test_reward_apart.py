"""The helpers' early rejection (issue 47, item 5): a near miss whose value plainly differs is answered without
sympy's simplify, and never where math_verify itself would call the two equal."""

from __future__ import annotations

import logging
import signal
import warnings

import pytest
from test_reward import load_reward

from llm_rl.qwen2_5 import reward_cases
from llm_rl.qwen2_5.bench_reward import FRESH_PATH, policy_workload


@pytest.fixture(scope="module")
def reward():
    return load_reward()


@pytest.fixture(scope="module")
def mv():
    """math_verify as the helpers run it: its SIGALRM timers off, its deprecation logging quiet."""
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    from math_verify import parse, verify

    alarm = signal.alarm
    signal.alarm = lambda seconds: 0
    yield parse, verify
    signal.alarm = alarm
    logging.disable(logging.NOTSET)


# math_verify calls each pair equal, by a rule a numeric check could get wrong: a float against a fraction or
# \pi to 6 decimals, an equation's right-hand side, a word as a product of letters, a letter's root and modulus,
# a fraction equal where it is defined, large floats within 15 digits
EQUAL_BY_MATH_VERIFY = [
    ("\\pi", "3.14159265"),
    ("\\sqrt{x^2}", "|x|"),
    ("\\frac{x^2-1}{x-1}", "x+1"),
    ("\\frac{1}{3}", "0.333333"),
    ("x=2", "2"),
    ("y=2x+1", "y=1+2x"),
    ("\\text{odd}", "odd"),
    ("2\\sqrt{x}", "\\sqrt{4x}"),
    ("e^{3}", "e^3"),
    ("\\ln 8", "3\\ln 2"),
    ("\\sin^2 x + \\cos^2 x", "1"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("(1,2)", "(1, 2)"),
    ("1234567.890123", "1234567.8901234"),
]
# near misses it rejects only through simplify, which the check answers in a fraction of the time
APART = [
    ("e^{3}", "e^{4}"),
    ("3\\sqrt{x}", "3\\sqrt{2x}"),
    ("\\sqrt[3]{5}", "\\sqrt{5}"),
    ("11xy", "11x+y"),
    ("2\\cos{1}", "2\\sin{1}"),
    ("\\ln 7", "\\log_{10} 7"),
]


def test_what_math_verify_calls_equal_is_never_rejected(reward, mv):
    parse, verify = mv
    apart = reward._Apart()
    for truth, answer in EQUAL_BY_MATH_VERIFY:
        gold, pred = parse("\\boxed{" + truth + "}"), parse("\\boxed{" + answer + "}")
        assert verify(gold, pred), (truth, answer)
        assert not apart(gold, pred), (truth, answer)


def test_a_plain_near_miss_is_rejected_and_math_verify_agrees(reward, mv):
    parse, verify = mv
    apart = reward._Apart()
    for truth, answer in APART:
        gold, pred = parse("\\boxed{" + truth + "}"), parse("\\boxed{" + answer + "}")
        assert apart(gold, pred), (truth, answer)
        assert not verify(gold, pred), (truth, answer)


def test_on_every_pair_of_the_fresh_workload_and_generated_shapes_math_verify_agrees(reward, mv):
    """Every (truth, answer) pair of half the fresh policy workload and 100 generated pairs: where the check rejects,
    math_verify says different; and it rejects most near misses, so it is not a check that never fires."""
    parse, verify = mv
    apart = reward._Apart()
    pairs = []
    for response, truth, _ in policy_workload(0.0, 0, FRESH_PATH)[:384]:
        prep = reward._prepare(response, truth)
        if prep.answer is not None:
            pairs.append((prep.gold.sane, reward._for_sympy(prep.answer.text), prep.answer.boxed))
    for _, answer, truth in reward_cases.generated_pairs(100, 11):
        pairs.append(((truth,), answer, True))
    rejected = different = 0
    for truths, answer, boxed in dict.fromkeys(pairs):
        pred = parse("\\boxed{" + answer + "}" if boxed else answer)
        for truth in truths:
            gold = parse("\\boxed{" + truth + "}")
            gone, equal = apart(gold, pred), verify(gold, pred)
            assert not (gone and equal), (truth, answer)
            rejected += gone
            different += not equal
    assert different > 50 and rejected > 0.8 * different


def test_values_found_by_quadrature_are_left_to_math_verify(reward, mv):
    """An integral's value is evalf's quadrature, with no bound on its error: never rejected on it (and the
    fault tests' stuck answer, an integral sympy runs on for minutes, still reaches its CPU bound)."""
    parse, _ = mv
    apart = reward._Apart()
    for answer in ("\\int_0^{1} x \\, dx", "\\int_0^{3} \\sin(x^{x}) \\, dx", "\\sum_{k=1}^{10} k"):
        assert not apart(parse("\\boxed{7}"), parse("\\boxed{" + answer + "}")), answer
