"""The reward's hard judgements, as data: for each category, answers equal in value to the truth (judged
right) and near misses off by a sign, a factor, an endpoint or a base (judged wrong), each category both
ways round where the rule is symmetric. tests/qwen2_5/test_reward_hard.py asserts every verdict;
`python3 -m llm_rl.qwen2_5.bench_reward --scenario hard` prints the accuracy of each reward version on them.
"""

from __future__ import annotations

import math


def both_ways(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return pairs + [(b, a) for a, b in pairs]


REPEATING_RIGHT = both_ways(
    [
        ("0.\\overline{6}", "\\frac{2}{3}"),
        ("0.1\\overline{6}", "\\frac{1}{6}"),
        ("1.\\overline{3}", "\\frac{4}{3}"),
        ("0.\\overline{142857}", "\\frac{1}{7}"),
        ("0.\\overline{09}", "\\frac{1}{11}"),
        ("2.4\\overline{36}", "\\frac{268}{110}"),
        ("-0.\\overline{3}", "-\\frac13"),
        ("0.\\overline{9}", "1"),
        ("0.1\\dot{6}", "\\frac{1}{6}"),
        ("0.\\dot{1}4285\\dot{7}", "\\frac{1}{7}"),
        ("0.8\\overline{3}", "\\dfrac{5}{6}"),
        ("0.\\overline{6}", "2/3"),
        ("0.1\\bar{6}", "\\frac16"),
        ("0.(6)", "\\frac23"),
        ("−0.\\overline{6}", "-\\frac23"),  # a Unicode minus
    ]
)
REPEATING_WRONG = both_ways(
    [
        ("0.\\overline{6}", "\\frac{1}{6}"),  # the period is not a digit after the point
        ("0.\\overline{6}", "-\\frac{2}{3}"),  # sign
        ("0.\\overline{3}", "\\frac{2}{3}"),
        ("1.\\overline{3}", "\\frac{3}{4}"),
        ("0.1\\overline{6}", "\\frac{1}{3}"),  # factor 2
        ("0.\\overline{16}", "\\frac{1}{6}"),  # 16/99
        ("0.\\overline{6}", "0.6"),
        ("0.\\overline{142857}", "\\frac{1}{8}"),
    ]
)
UNITS_RIGHT = [
    ("36°", "36^\\circ"),
    ("36^\\circ", "36°"),
    ("36^{\\circ}", "36°"),
    ("36", "36^\\circ"),
    ("36°", "36"),
    ("120^\\circ", "120^{\\circ}"),
    ("12.5", "12.5\\%"),
    ("12.5\\%", "12.5"),
    ("25\\%", "25\\%"),
    ("\\frac{25}{2}", "12.5\\%"),
    ("36\\text{ degrees}", "36^\\circ"),
    ("36 °", "36^{\\circ}"),
    ("5\\text{ cm}", "5"),
    ("5", "5\\text{ cm}"),
    ("12.5\\text{ percent}", "12.5\\%"),
]
UNITS_WRONG = [
    ("35°", "36^\\circ"),
    ("36°", "-36^\\circ"),
    ("72^\\circ", "36°"),
    ("360", "36^\\circ"),
    ("1.25", "12.5\\%"),
    ("125", "12.5\\%"),
    ("-12.5", "12.5\\%"),
    ("12.5\\%", "125"),
    ("6", "5\\text{ cm}"),
]
COMPLEX_RIGHT = both_ways(
    [
        ("0.6+0.8i", "\\frac{3}{5}+\\frac{4}{5}i"),
        ("\\frac{3+4i}{5}", "\\frac{3}{5}+\\frac{4}{5}i"),
        ("\\frac{3}{5}+\\frac45i", "0.6+0.8i"),
        ("\\frac{5}{3-4i}", "\\frac{3}{5}+\\frac{4}{5}i"),
        ("\\frac{4i+3}{5}", "0.6+0.8i"),
        ("-1+2i", "2i-1"),
        ("(1+i)^2", "2i"),
        ("i^2", "-1"),
        ("\\frac{1}{2}-\\frac{\\sqrt{3}}{2}i", "\\frac{1-i\\sqrt{3}}{2}"),
        ("-i", "\\frac{1}{i}"),
        ("3-4i", "3 - 4i"),
        ("0.6+0.8\\mathrm{i}", "\\frac35+\\frac45i"),
    ]
)
COMPLEX_WRONG = both_ways(
    [
        ("0.6-0.8i", "\\frac{3}{5}+\\frac{4}{5}i"),  # conjugate
        ("\\frac{4+3i}{5}", "\\frac{3}{5}+\\frac{4}{5}i"),  # parts swapped
        ("3+4i", "\\frac{3}{5}+\\frac{4}{5}i"),  # factor 5
        ("-0.6-0.8i", "0.6+0.8i"),  # sign
        ("2i", "2"),
        ("i", "-i"),
        ("1+i", "(1+i)^2"),
    ]
)
INEQUALITY_RIGHT = both_ways(
    [
        ("3>x>-2", "-2<x<3"),
        ("3 > x > -2", "-2 < x < 3"),
        ("3\\geq x\\geq -2", "-2\\le x\\le 3"),
        ("3\\ge x>-2", "-2<x\\leq3"),
        ("x>-2", "-2<x"),
        ("x\\geq 1", "1\\leq x"),
        ("\\frac12>y", "y<0.5"),
        ("3\\gt x\\gt -2", "-2\\lt x\\lt 3"),
    ]
)
INEQUALITY_WRONG = both_ways(
    [
        ("3>x>2", "-2<x<3"),  # endpoint sign
        ("3\\geq x>-2", "-2<x<3"),  # an endpoint included
        ("3>x\\geq -2", "-2<x<3"),
        ("4>x>-2", "-2<x<3"),
        ("x>2", "x<2"),
        ("x\\geq 1", "1<x"),
        ("-2>x>3", "-2<x<3"),
    ]
)
BASES_RIGHT = [
    ("1011_2", "1011_2"),
    ("1011_{2}", "1011_2"),
    ("1011_2", "1011_{2}"),
    ("1011", "1011_2"),
    ("01011_2", "1011_2"),
    ("\\text{A3}_{16}", "A3_{16}"),
    ("A3", "A3_{16}"),
    ("2012_3", "2012_{3}"),
    ("11_{10}", "11"),
    ("(1011)_2", "1011_2"),
    ("a3_{16}", "A3_{16}"),
    ("a3", "A3_{16}"),
]
BASES_WRONG = [
    ("1011_3", "1011_2"),  # the false positive: the base is part of the value
    ("1011_2", "1011_3"),
    ("1011_{10}", "1011_2"),
    ("102_3", "1011_2"),  # the same number, not in the base asked for
    ("11", "1011_2"),  # its value in base 10
    ("1011_2", "11"),
    ("1012", "1011_2"),  # 2 is no binary digit
    ("1001_2", "1011_2"),
    ("A4_{16}", "A3_{16}"),
    ("2012_4", "2012_3"),
    ("a4", "A3_{16}"),
]
BOXES_RIGHT = [
    ("\\boxed{\\frac{1}{2}} = \\boxed{0.5}", "\\frac12"),
    ("\\boxed{0.5} = \\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{0.\\overline{3}}, i.e. \\boxed{\\frac13}", "\\frac13"),
    ("\\boxed{x^2+2x+1} = \\boxed{(x+1)^2}", "(x+1)^2"),  # equal as polynomials
    ("\\boxed{2} \\boxed{2.0}", "2"),
    ("\\boxed{3>x>-2} \\boxed{-2<x<3}", "-2<x<3"),
]
BOXES_WRONG = [
    ("\\boxed{\\frac{1}{2}} = \\boxed{0.6}", "\\frac12"),  # disagree in value: refused
    ("\\boxed{\\frac{1}{2}} = \\boxed{0.6}", "0.6"),
    ("\\boxed{x^2+2x+1} = \\boxed{(x+2)^2}", "(x+2)^2"),
    ("\\boxed{x^2+2x+1} = \\boxed{(x+2)^2}", "(x+1)^2"),
    ("\\boxed{1} \\boxed{-1}", "1"),
    ("\\boxed{\\frac12} = \\boxed{0.5}", "0.25"),  # agree with each other, not with the truth
    ("\\boxed{9^{9^{9^{9^{9}}}}} = \\boxed{1}", "1"),  # a box sympy cannot compare in time: refused
]
INTERVAL_RIGHT = both_ways(
    [
        ("(-2,3)", "-2<x<3"),
        ("x\\in(-2,3)", "3>x>-2"),
        ("[-2,3)", "-2\\le x<3"),
        ("(1,\\infty)", "x>1"),
        ("(-\\infty,3]", "3\\geq x"),
        ("\\{x \\mid -2<x<3\\}", "(-2,3)"),
        ("\\{x : 3>x>-2\\}", "-2<x<3"),
    ]
)
INTERVAL_WRONG = both_ways(
    [
        ("(-2,3]", "-2<x<3"),  # an endpoint included
        ("(-2,4)", "-2<x<3"),
        ("[1,\\infty)", "x>1"),
        ("(-\\infty,1)", "x>1"),  # the other side
        ("(2,3)", "-2<x<3"),  # sign
        ("\\{x \\mid x>1\\}", "x<1"),
        ("\\{x \\mid -2<x\\le 3\\}", "(-2,3)"),
    ]
)
ROOT_RIGHT = both_ways(
    [
        ("\\sqrt{12}", "2\\sqrt{3}"),
        ("\\sqrt{1372}", "14\\sqrt{7}"),
        ("\\frac{1}{\\sqrt{3}}", "\\frac{\\sqrt{3}}{3}"),
        ("\\frac{\\sqrt{8}}{2}", "\\sqrt{2}"),
        ("\\sqrt{\\frac{3}{4}}", "\\frac{\\sqrt3}{2}"),
        ("\\frac{1}{1+\\sqrt{2}}", "\\sqrt{2}-1"),
        ("\\frac{2}{\\sqrt{5}-\\sqrt{3}}", "\\sqrt{5}+\\sqrt{3}"),
        ("(\\sqrt{2}+\\sqrt{3})^2", "5+2\\sqrt{6}"),
        ("\\sqrt{2}\\cdot\\sqrt{6}", "2\\sqrt3"),
        ("3\\sqrt{2}/2", "\\frac{3}{\\sqrt{2}}"),
        ("1.5\\sqrt{2}", "\\frac{3\\sqrt{2}}{2}"),
        ("\\sqrt{16}", "4"),
    ]
)
ROOT_WRONG = both_ways(
    [
        ("\\sqrt{12}", "3\\sqrt{2}"),
        ("2\\sqrt{3}", "3\\sqrt{2}"),
        ("-2\\sqrt{3}", "2\\sqrt{3}"),  # sign
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{2}}{3}"),
        ("\\sqrt{2}+1", "\\sqrt{2}-1"),
        ("(\\sqrt{2}+\\sqrt{3})^2", "5"),
        ("\\sqrt{3}", "3"),
        ("\\sqrt{999983\\cdot 2}", "\\sqrt{1999965}"),  # a large prime factor, off by one
    ]
)
PI_RIGHT = both_ways(
    [
        ("\\frac{86}{84}\\pi", "\\frac{86\\pi}{84}"),
        ("43\\pi/42", "\\frac{86\\pi}{84}"),
        ("\\frac{\\pi}{2}", "0.5\\pi"),
        ("2\\pi\\cdot 3", "6\\pi"),
        ("\\pi^2/4", "\\left(\\frac{\\pi}{2}\\right)^2"),
        ("16-4\\pi", "4(4-\\pi)"),
        ("\\frac{8\\sqrt{2}\\pi}{3}", "\\frac{16\\pi}{3\\sqrt{2}}"),
    ]
)
PI_WRONG = both_ways(
    [
        ("\\frac{\\pi}{84}", "\\frac{86\\pi}{84}"),
        ("\\pi", "3"),
        ("2\\pi", "\\pi^2"),
        ("16-4\\pi", "4\\pi-16"),  # sign
        ("\\frac{\\pi}{3}", "\\frac{3}{\\pi}"),
    ]
)
POLYNOMIAL_RIGHT = both_ways(
    [
        ("(x+90)(x+79)", "x^2+169x+7110"),
        ("x^2-1", "(x-1)(x+1)"),
        (
            "(x+1)^{12}",
            "x^{12}+12x^{11}+66x^{10}+220x^9+495x^8+792x^7+924x^6+792x^5+495x^4+220x^3+66x^2+12x+1",
        ),
        ("\\frac{x^2-1}{x-1}", "x+1"),
        ("\\frac{2x}{x}", "2"),
        ("2(a+b)", "2b+2a"),
        ("\\frac{1}{x}+\\frac{1}{y}", "\\frac{x+y}{x\\cdot y}"),
        ("3t^2-\\frac{t}{2}", "\\frac{6t^2-t}{2}"),
        ("0.5x", "\\frac{x}{2}"),
    ]
)
POLYNOMIAL_WRONG = both_ways(
    [
        ("(x+90)(x+80)", "x^2+169x+7110"),
        ("x^2+79x", "x^2+169x+7110"),
        ("(x-1)^{12}", "(x+1)^{12}"),
        ("2x", "2y"),  # another variable
        ("x", "5"),
        ("b", "x"),
        ("x^2+1", "(x-1)(x+1)"),
        ("\\frac{1}{x}+\\frac{1}{y}", "\\frac{1}{x+y}"),
    ]
)
POINT_RIGHT = both_ways(
    [
        ("(51, -99)", "(51,-99)"),
        ("(\\frac{1}{2},3)", "(0.5,3)"),
        ("(2\\sqrt{3}, \\pi)", "(\\sqrt{12},\\pi)"),
        ("(1,2,3)", "(1, 2, 3)"),
        ("(2,\\infty)", "(2,\\infty)"),
    ]
)
POINT_WRONG = both_ways(
    [
        ("(51,99)", "(51,-99)"),
        ("(-99,51)", "(51,-99)"),  # the order matters
        ("(2,1)", "(1,2)"),
        ("(1,2,4)", "(1,2,3)"),
        ("(3,\\infty)", "(2,\\infty)"),
    ]
)
CATEGORIES = {  # name: (judged right, judged wrong)
    "repeating decimal": (REPEATING_RIGHT, REPEATING_WRONG),
    "degree or percent sign": (UNITS_RIGHT, UNITS_WRONG),
    "complex number": (COMPLEX_RIGHT, COMPLEX_WRONG),
    "inequality": (INEQUALITY_RIGHT, INEQUALITY_WRONG),
    "interval": (INTERVAL_RIGHT, INTERVAL_WRONG),
    "base": (BASES_RIGHT, BASES_WRONG),
    "several boxes": (BOXES_RIGHT, BOXES_WRONG),
    "square root": (ROOT_RIGHT, ROOT_WRONG),
    "pi": (PI_RIGHT, PI_WRONG),
    "polynomial": (POLYNOMIAL_RIGHT, POLYNOMIAL_WRONG),
    "point": (POINT_RIGHT, POINT_WRONG),
}
RIGHT = [(name, a, t) for name, (right, _) in CATEGORIES.items() for a, t in right]
WRONG = [(name, a, t) for name, (_, wrong) in CATEGORIES.items() for a, t in wrong]


def _signed(coef: int, term: str = "") -> str:
    """+3x, -x, +7: a term with its sign, a coefficient of 1 left out before a letter."""
    sign = "-" if coef < 0 else "+"
    size = abs(coef)
    return f"{sign}{'' if size == 1 and term else size}{term}"


def generated_pairs(n: int, seed: int) -> list[tuple[str, str, str]]:
    """n (shape, answer, truth) pairs with fresh numbers: square roots, pi, polynomials, rational functions and
    points, each written as the truth is or another way, or as a near miss.  Their verdicts are math_verify's
    (tests/qwen2_5/test_reward_hard.py checks that the cheap checks never disagree with it)."""
    import random

    rng = random.Random(seed)
    out: list[tuple[str, str, str]] = []
    while len(out) < n:
        a, b = rng.choice([-1, 1]) * rng.randint(1, 30), rng.choice([-1, 1]) * rng.randint(1, 30)
        k, m = rng.randint(2, 12), rng.choice([2, 3, 5, 6, 7, 10, 11, 13, 14, 15, 17, 19, 21, 22, 23])
        p, q = rng.randint(1, 60), rng.randint(2, 60)
        kind = rng.randrange(7)
        if kind == 0:  # a quadratic, factored
            truth = f"x^2{_signed(a + b, 'x') if a + b else ''}{_signed(a * b)}"
            answers = [f"(x{_signed(a)})(x{_signed(b)})", f"(x{_signed(b)})(x{_signed(a)})"]
            answers += [f"(x{_signed(a)})(x{_signed(b + 1)})", f"(x{_signed(-a)})(x{_signed(-b)})"]
        elif kind == 1:  # a cube
            truth = f"x^3{_signed(3 * a, 'x^2')}{_signed(3 * a * a, 'x')}{_signed(a**3)}"
            answers = [f"(x{_signed(a)})^3", f"(x{_signed(-a)})^3", f"(x{_signed(a)})^2(x{_signed(a)})"]
        elif kind == 2:  # a square root
            truth = f"{k}\\sqrt{{{m}}}"
            answers = [
                f"\\sqrt{{{k * k * m}}}",
                f"\\frac{{{k * m}}}{{\\sqrt{{{m}}}}}",
                f"{k + 1}\\sqrt{{{m}}}",
            ]
            answers += [
                f"\\sqrt{{{k * k * m + 1}}}",
                f"{k}\\sqrt{{{m + 1}}}",
                f"\\frac{{{2 * k}\\sqrt{{{m}}}}}{{2}}",
            ]
        elif kind == 3:  # pi
            truth = f"\\frac{{{p}\\pi}}{{{q}}}"
            answers = [f"\\frac{{{p}}}{{{q}}}\\pi", f"{p}\\pi/{q}", f"\\frac{{{2 * p}\\pi}}{{{2 * q}}}"]
            answers += [
                f"\\frac{{\\pi}}{{{q}}}",
                f"\\frac{{{p}}}{{{q}\\pi}}",
                f"\\frac{{{p + 1}\\pi}}{{{q}}}",
            ]
        elif kind == 4:  # a rational function
            truth = f"x{_signed(a)}"
            answers = [f"\\frac{{x^2-{a * a}}}{{x{_signed(-a)}}}", f"\\frac{{x^2-{a * a}}}{{x{_signed(a)}}}"]
            answers += [f"\\frac{{{k}x{_signed(k * a)}}}{{{k}}}"]
        elif kind == 5:  # a rationalised denominator
            truth = f"\\frac{{{k}-\\sqrt{{{m}}}}}{{{k * k - m}}}" if k * k != m else "1"
            answers = [f"\\frac{{1}}{{{k}+\\sqrt{{{m}}}}}", f"\\frac{{1}}{{{k}-\\sqrt{{{m}}}}}"]
        else:  # a point
            truth = f"({a},{k}\\sqrt{{{m}}})"
            answers = [f"({a}, \\sqrt{{{k * k * m}}})", f"({k}\\sqrt{{{m}}},{a})", f"({-a},{k}\\sqrt{{{m}}})"]
        shape = ("quadratic", "cube", "square root", "pi", "rational function", "denominator", "point")[kind]
        out.append((shape, rng.choice(answers), truth))
    return out


def form_pairs(n: int, seed: int) -> list[tuple[str, str, str]]:
    """n (shape, answer, truth) pairs beyond square roots and pi: n-th roots and fractional powers, powers of e,
    logarithms, sines and cosines of numbers, roots and products of letters, binomial coefficients; each written as
    the truth is, another way, or as a near miss.  Whatever the cheap checks decide of them must be math_verify's
    verdict (tests/qwen2_5/test_reward_forms.py)."""
    import random

    rng = random.Random(seed)
    out: list[tuple[str, str, str]] = []
    while len(out) < n:
        c, d = rng.randint(2, 12), rng.randint(2, 9)
        k = rng.choice([2, 3, 5, 6, 7, 10, 11, 12, 13, 15, 17, 20, 21, 28, 30, 45])
        r = rng.choice([2, 3, 4, 5])
        kind = rng.randrange(9)
        if kind == 0:  # an r-th root
            truth = f"\\sqrt[{r}]{{{k}}}"
            answers = [f"{k}^{{1/{r}}}", f"{k}^{{\\frac{{1}}{{{r}}}}}", f"\\sqrt[{r}]{{{k * c**r}}}/{c}"]
            answers += [
                f"\\sqrt[{r}]{{{k + 1}}}",
                f"\\sqrt[{r + 1}]{{{k}}}",
                f"{k}^{{{r}}}",
                f"\\frac{{{k}}}{{{r}}}",
            ]
        elif kind == 1:  # a fractional power
            truth = f"{k}^{{{d}/{r}}}"
            answers = [
                f"\\sqrt[{r}]{{{k}^{d}}}",
                f"({k}^{{1/{r}}})^{{{d}}}",
                f"{k}^{{\\frac{{{d * c}}}{{{r * c}}}}}",
            ]
            answers += [f"{k}^{{{r}/{d}}}", f"\\sqrt[{r}]{{{k}}}", f"{k + 1}^{{{d}/{r}}}"]
        elif kind == 2:  # a power of e
            truth = f"e^{{{d}}}"
            answers = [
                f"e^{d}",
                f"e^{{{d - 1}}}\\cdot e",
                f"\\frac{{e^{{{d + 1}}}}}{{e}}",
                f"(e^{{{d}/2}})^2",
            ]
            answers += [f"e^{{-{d}}}", f"{d}e", f"e^{{{d + 1}}}", f"{d}^e"]
        elif kind == 3:  # a logarithm
            truth = f"{c}\\ln {k}"
            answers = [f"{c}\\ln({k})", f"{c}\\ln{{{k}}}", f"\\ln {k}\\cdot {c}"]
            answers += [f"{c}\\ln {k + 1}", f"{c + 1}\\ln {k}", f"{c}\\log_{{10}} {k}", f"\\ln {k * c}"]
        elif kind == 4:  # a sine or cosine of a number
            f, g = rng.sample(["\\sin", "\\cos", "\\tan"], 2)
            arg = rng.choice([str(d), f"\\frac{{\\pi}}{{{k}}}", f"\\frac{{{d}}}{{{c}}}"])
            truth = f"{c}{f}{{{arg}}}"
            answers = [
                f"{c}{f}({arg})",
                f"{c} {f} {arg}" if arg.isdigit() else f"{c}{f}{arg}",
                f"{f}{{{arg}}}\\cdot {c}",
            ]
            answers += [f"{c}{g}{{{arg}}}", f"{c + 1}{f}{{{arg}}}", f"{c}{f}{{{arg}+1}}"]
        elif kind == 5:  # a root of a letter
            truth = f"{c}\\sqrt{{x}}"
            answers = [f"{c}x^{{1/2}}", f"\\sqrt{{{c * c}x}}", f"\\frac{{{c}x}}{{\\sqrt{{x}}}}"]
            answers += [f"{c}x", f"{c}\\sqrt{{2x}}", f"{c + 1}\\sqrt{{x}}", f"\\sqrt{{{c}x}}"]
        elif kind == 6:  # a product of letters
            truth = f"{c}xy"
            answers = [f"{c}yx", f"{c}\\cdot xy", f"{c}x\\cdot y"]
            answers += [f"{c}x^2y", f"{c}x+y", f"{c + 1}xy", f"{c}xy^2"]
        elif kind == 7:  # a binomial coefficient
            m = rng.randint(4, 14)
            j = rng.randint(1, m - 1)
            truth = str(math.comb(m, j))
            answers = [f"\\binom{{{m}}}{{{j}}}", f"\\dbinom{{{m}}}{{{m - j}}}"]
            answers += [
                f"\\binom{{{m + 1}}}{{{j}}}",
                f"\\binom{{{m}}}{{{j + 1}}}" if j + 1 < m - j else f"{m}",
            ]
        else:  # a sum of radicals
            truth = f"{c}+\\sqrt[3]{{{k}}}"
            answers = [
                f"\\sqrt[3]{{{k}}}+{c}",
                f"{c}+{k}^{{1/3}}",
                f"\\frac{{{2 * c}+2\\sqrt[3]{{{k}}}}}{{2}}",
            ]
            answers += [f"{c}+\\sqrt{{{k}}}", f"{c}-\\sqrt[3]{{{k}}}", f"{c}\\sqrt[3]{{{k}}}"]
        shape = ("root", "power", "e", "log", "trig", "letter root", "letters", "binomial", "radical sum")[
            kind
        ]
        out.append((shape, rng.choice(answers), truth))
    return out


# ---------------------------------------------------------------- a policy's answers (issue 47)
#
# Answers shaped like a GRPO policy's on MATH, for the benchmark: prompts of MATH's answer kinds (integers,
# fractions, roots, pi, polynomials, points, intervals and unions, solution sets, matrices and vectors, multiple
# choice, percents, units, logarithms, words), 8 samples per prompt, about 60 % right (other spellings of the
# truth) and the rest near misses, written as a policy writes them: mostly \boxed{} in the <answer> block, else
# bare in the block, untagged with a final \boxed{}, with text after </answer>, or with an earlier \boxed{} in
# the reasoning.  tests/qwen2_5/reward_policy_workload.jsonl is policy_answers(512, 47), kept as test data.


def _policy_problem(rng) -> tuple[str, str, list[str], list[str]]:
    """(kind, truth, right spellings, near misses) of one MATH-like prompt with fresh numbers."""
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    b += b == a
    k, m = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7, 10, 11, 13])
    kind = rng.choice(
        ["integer"] * 6
        + ["fraction"] * 4
        + ["root", "pi", "polynomial", "point", "interval", "union", "set", "matrix", "choice"]
        + ["percent", "unit", "log", "word", "decimal"]
    )
    if kind == "integer":
        n = a * b
        return kind, str(n), [str(n), f"{n}.", f"${n}$"], [str(n + 1), str(n - 1), str(a + b)]
    if kind == "fraction":
        return (
            kind,
            f"\\frac{{{a}}}{{{a + b}}}",
            [
                f"\\frac{{{a}}}{{{a + b}}}",
                f"\\dfrac{{{a}}}{{{a + b}}}",
                f"{a}/{a + b}",
                f"\\frac{{{2 * a}}}{{{2 * (a + b)}}}",
            ],
            [f"\\frac{{{a + b}}}{{{a}}}", f"\\frac{{{a + 1}}}{{{a + b}}}", f"\\frac{{{b}}}{{{a + b}}}"],
        )
    if kind == "decimal":
        return kind, f"{a}.5", [f"{a}.5", f"\\frac{{{2 * a + 1}}}{{2}}", f"{a}.50"], [f"{a}.4", f"{a + 1}.5"]
    if kind == "root":
        return (
            kind,
            f"{k}\\sqrt{{{m}}}",
            [f"{k}\\sqrt{{{m}}}", f"\\sqrt{{{k * k * m}}}", f"{k} \\sqrt{{ {m} }}"],
            [f"{k + 1}\\sqrt{{{m}}}", f"{k}\\sqrt{{{m + 1}}}", f"\\sqrt{{{k * m}}}"],
        )
    if kind == "pi":
        return (
            kind,
            f"\\frac{{{a}\\pi}}{{{b}}}",
            [f"\\frac{{{a}}}{{{b}}}\\pi", f"{a}\\pi/{b}", f"\\frac{{{a}\\pi}}{{{b}}}"],
            [f"\\frac{{{b}\\pi}}{{{a}}}", f"\\frac{{{a}}}{{{b}}}"],
        )
    if kind == "polynomial":
        return (
            kind,
            f"x^2+{a + b}x+{a * b}",
            [f"(x+{a})(x+{b})", f"x^2+{a + b}x+{a * b}"],
            [f"(x+{a})(x+{b + 1})", f"(x-{a})(x-{b})"],
        )
    if kind == "point":
        return (
            kind,
            f"({a},-{b})",
            [f"({a}, -{b})", f"\\left({a},-{b}\\right)"],
            [f"(-{b},{a})", f"({a},{b})"],
        )
    if kind == "interval":
        return (
            kind,
            f"[{a},{a + b})",
            [f"[{a}, {a + b})", f"\\left[{a},{a + b}\\right)"],
            [f"({a},{a + b})", f"[{a},{a + b}]", f"[{a},{a + b + 1})"],
        )
    if kind == "union":
        return (
            kind,
            f"(-\\infty,{a})\\cup({a + b},\\infty)",
            [f"(-\\infty, {a}) \\cup ({a + b}, \\infty)"],
            [f"(-\\infty,{a}]\\cup[{a + b},\\infty)", f"({a},{a + b})"],
        )
    if kind == "set":
        return (
            kind,
            f"{a}, -{b}",
            [f"-{b}, {a}", f"{a},-{b}", f"x={a} \\text{{ or }} x=-{b}"],
            [f"{a}, {b}", f"{a}"],
        )
    if kind == "matrix":
        return (
            kind,
            f"\\begin{{pmatrix}} {a} \\\\ -{b} \\end{{pmatrix}}",
            [
                f"\\begin{{pmatrix}}{a}\\\\-{b}\\end{{pmatrix}}",
                f"\\begin{{bmatrix}} {a} \\\\ -{b} \\end{{bmatrix}}",
            ],
            [
                f"\\begin{{pmatrix}} {a} \\\\ {b} \\end{{pmatrix}}",
                f"\\begin{{pmatrix}} -{b} \\\\ {a} \\end{{pmatrix}}",
            ],
        )
    if kind == "choice":
        letter = "ABCDE"[a % 5]
        other = "ABCDE"[(a + 1) % 5]
        return (
            kind,
            f"\\text{{({letter})}}",
            [f"\\text{{({letter})}}", f"({letter})"],
            [f"\\text{{({other})}}", f"({other})"],
        )
    if kind == "percent":
        return kind, f"{a}\\%", [f"{a}\\%", f"{a}"], [f"{a + 1}\\%", f"{b}\\%"]
    if kind == "unit":
        return kind, f"{a}\\text{{ cm}}", [f"{a}\\text{{ cm}}", f"{a}"], [f"{a + 1}\\text{{ cm}}", f"{b}"]
    if kind == "log":
        return (
            kind,
            f"\\log_{{2}} {a}",
            [f"\\log_2 {a}", f"\\log_{{2}}{{{a}}}"],
            [f"\\log_3 {a}", f"\\log_2 {a + 1}"],
        )
    day, other_day = rng.sample(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"], 2)
    return kind, f"\\text{{{day}}}", [f"\\text{{{day}}}", day], [f"\\text{{{other_day}}}", other_day]


_PROSE = [
    "We solve the equation",
    "Substitute the value",
    "Therefore we simplify",
    "Check the result",
    "Compute",
]


def _policy_response(rng, answer: str, earlier: str) -> str:
    """One response around answer in a shape a policy writes (the shares in the comment above)."""
    steps = "".join(
        f"Step {i}: {rng.choice(_PROSE)} and {'compute ' * rng.randint(3, 30)}.\n"
        for i in range(1, rng.randint(2, 6))
    )
    bare = answer[1:-1] if answer.startswith("$") and answer.endswith("$") else answer
    boxed = f"\\boxed{{{bare}}}"
    shape = rng.random()
    if shape < 0.71:  # boxed in the block
        return f"<think>\n{steps}</think>\n<answer>\n{rng.choice(['The answer is ', '', 'So '])}{boxed}.\n</answer>"
    if shape < 0.81:  # bare in the block
        return f"<think>\n{steps}</think>\n<answer>\n{rng.choice(['', 'The answer is '])}${bare}$\n</answer>"
    if shape < 0.89:  # untagged, a final box
        return f"{steps}So the final answer is {boxed}."
    if shape < 0.95:  # text after the block
        return f"<think>\n{steps}</think>\n<answer>\n{boxed}\n</answer>\nI hope this helps!"
    # an earlier box in the reasoning, taken back before the final one
    return f"<think>\n{steps}First I got \\boxed{{{earlier}}}.\nWait, let me recheck.\n</think>\n<answer>\n{boxed}\n</answer>"


def policy_answers(n: int, seed: int) -> list[tuple[str, str, bool]]:
    """n (response, truth, right) items, 8 samples per prompt, about 60 % right."""
    import random

    rng = random.Random(seed)
    out: list[tuple[str, str, bool]] = []
    while len(out) < n:
        _kind, truth, right, wrong = _policy_problem(rng)
        for _ in range(8):
            correct = rng.random() < 0.6
            answer = rng.choice(right if correct else wrong)
            out.append((_policy_response(rng, answer, rng.choice(wrong)), truth, correct))
    return out[:n]


# ---------------------------------------------------------------- held-out policy answers (issue 47)
#
# A second policy-shaped workload, held out from the exact rules written for the first: other seeds and size,
# half its prompts of answer kinds policy_answers never draws (dollars, degrees, units in words and squared units,
# powers of ten, negative fractions, roots over integers) and two more ways of writing the final box.
# tests/qwen2_5/reward_policy_heldout.jsonl is policy_answers_heldout(768, 4747), kept as test data.


def _heldout_problem(rng) -> tuple[str, str, list[str], list[str]]:
    """(kind, truth, right spellings, near misses) in kinds the first workload does not hold."""
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    b += b == a
    k, m = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7, 10, 11, 13])
    kind = rng.choice(["dollars", "degrees", "unit word", "square unit", "power of ten", "negative", "surd"])
    if kind == "dollars":
        return kind, f"\\${a}", [f"\\${a}", f"{a}", f"\\${a}.00"], [f"\\${a + 1}", f"{b}"]
    if kind == "degrees":
        return (
            kind,
            f"{a}^\\circ",
            [f"{a}^\\circ", f"{a}", f"{a}^{{\\circ}}", f"{a} \\text{{ degrees}}"],
            [f"{a + 1}^\\circ", f"{b}"],
        )
    if kind == "unit word":
        unit = rng.choice(["inches", "meters", "feet", "miles"])
        return (
            kind,
            f"{a}\\text{{ {unit}}}",
            [f"{a}\\text{{ {unit}}}", f"{a}", f"{a} \\text{{{unit}}}"],
            [f"{a + 1}\\text{{ {unit}}}", f"{b}"],
        )
    if kind == "square unit":
        return (
            kind,
            f"{a}\\text{{ cm}}^2",
            [f"{a}\\text{{ cm}}^2", f"{a}"],
            [f"{a + 1}\\text{{ cm}}^2", f"{a + 1}"],
        )
    if kind == "power of ten":
        return (
            kind,
            f"{k}\\times 10^{{3}}",
            [f"{k}\\times 10^3", f"{k}000", f"{k} \\cdot 10^{{3}}"],
            [f"{k}\\times 10^4", f"{k}00"],
        )
    if kind == "negative":
        return (
            kind,
            f"-\\frac{{{a}}}{{{a + b}}}",
            [f"-\\frac{{{a}}}{{{a + b}}}", f"\\frac{{-{a}}}{{{a + b}}}", f"-{a}/{a + b}"],
            [f"\\frac{{{a}}}{{{a + b}}}", f"-\\frac{{{a + b}}}{{{a}}}"],
        )
    return (
        kind,
        f"\\frac{{\\sqrt{{{m}}}}}{{{k}}}",
        [f"\\frac{{\\sqrt{{{m}}}}}{{{k}}}", f"\\sqrt{{{m}}}/{k}", f"\\frac{{1}}{{{k}}}\\sqrt{{{m}}}"],
        [f"\\frac{{\\sqrt{{{m}}}}}{{{k + 1}}}", f"\\frac{{{k}}}{{\\sqrt{{{m}}}}}"],
    )


def _heldout_response(rng, answer: str, earlier: str) -> str:
    """Mostly _policy_response's shapes; a fifth in two it does not write (a bold Final Answer, a $\\boxed{}$)."""
    if rng.random() >= 0.2:
        return _policy_response(rng, answer, earlier)
    steps = "".join(f"Step {i}: {rng.choice(_PROSE)}.\n" for i in range(1, rng.randint(2, 5)))
    bare = answer[1:-1] if answer.startswith("$") and answer.endswith("$") else answer
    if rng.random() < 0.5:
        return f"<think>\n{steps}</think>\n<answer>\n**Final Answer**\n\\[\n\\boxed{{{bare}}}\n\\]\n</answer>"
    return f"<think>\n{steps}</think>\n<answer>\nThe answer is $\\boxed{{{bare}}}$.\n</answer>"


def policy_answers_heldout(n: int, seed: int) -> list[tuple[str, str, bool]]:
    """n (response, truth, right) items, 8 samples per prompt, about 60 % right; half the prompts in kinds of
    _heldout_problem, half of _policy_problem's with other numbers."""
    import random

    rng = random.Random(seed)
    out: list[tuple[str, str, bool]] = []
    while len(out) < n:
        _kind, truth, right, wrong = (_heldout_problem if rng.random() < 0.5 else _policy_problem)(rng)
        for _ in range(8):
            correct = rng.random() < 0.6
            answer = rng.choice(right if correct else wrong)
            out.append((_heldout_response(rng, answer, rng.choice(wrong)), truth, correct))
    return out[:n]
