"""MATH reward for GRPO: accuracy 0.7 (math_verify) + format 0.2 + chain of thought 0.1.

Self-contained (standard library + ``math_verify``): copy this one file into verl, TRL or your own loop.

* ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float``
  is verl's ``custom_reward_function`` contract; ``compute_score_dict`` returns the components too;
  ``compute_score_batch`` serves ``reward_model.reward_manager=batch``.
* The answer is the ``<answer>`` block, judged by value whatever its shape: ``\\boxed{}``, bare LaTeX, a
  ``$...$`` / ``\\(...\\)`` / ``\\[...\\]`` span, a sentence around it ("The answer is 7.", ``x = 5``), trailing
  punctuation, ``\\dfrac``, ``1,\\!000``, ``2\\frac{1}{2}``, a ``bmatrix``, a unit or degree sign the truth implies,
  Unicode math (``½``, ``2√3``, ``√(x+1)``, ``x²``, ``·``, ``×``, ``÷``, ``≤``, ``∞``, ``−``) read as its LaTeX in answers
  and truths, plain-text math (``sqrt(3)``, ``2*sqrt(3)``, ``pi/2``, ``1e3``) likewise, words (``Monday``,
  ``no solution`` for ``\\text{...}``), numbers in words (``twelve``) and several solutions joined
  by "or" / "and" (``x=1 or x=2``: the set of them, right for ``1, 2``; ``x = 5 or x = -5`` for ``\\pm 5``).
  Without a block, the last ``\\boxed{}`` after the reasoning; a box that a correction ("Wait, I made an error.")
  takes back does not compete with it.  Several boxes, or several ``<answer>`` blocks, must agree in value.
* No credit for hedging: an answer that offers more than one value, a range, a bound or an alternative
  (``4 but maybe 5``, ``3? 4? 5?``, ``between 4 and 5``, ``at least 5``, ``5 or more``) scores 0, unless the truth
  is itself that kind of object (an inequality, an interval, a set of solutions), when it is judged against it.
* Pairs and sets, one rule both ways: a bracketed tuple (``(3,-3)``) is ordered and right only for the same tuple;
  a list of solutions (``3, -3``, ``3 or -3``, ``\\pm 3``, ``\\{3,-3\\}``) is a set, right for the same set in any
  order; a pair is never right for a set nor a set for a pair.  Values of different unknowns (``x=2, y=3``) are the
  tuple written out, ``(2,3)``.
* A ground truth that holds no answer (``None``, ``""``, an empty box) raises ``NoGroundTruth`` (a ValueError).
* A wrong answer scores 0 and nothing else is counted.  A correct one scores 0.7, plus 0.05 for each of
  ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``, ``\\n</answer>`` present exactly once (0 if the
  tags are out of order; 0.001 off per character before ``<think>`` and after ``</answer>``, at most 0.1
  each), plus 0.1 / 0.05 for numbered steps with reasoning keywords inside ``<think>``.
* math_verify runs in helper processes, never in the caller, from any thread: each answer gets a hard bound
  (default 1 s) on the CPU time math_verify spends on it, and a worker that overruns is killed, so the
  stuck computation really stops.  Waiting for a worker, helpers that die and other answers' load never
  cost an answer its score; no helper outlives the caller.  Cheap checks in the caller decide most
  answers without sympy, by exact rationals where the values are rational: repeating decimals
  (``0.1\\overline{6}`` = 1/6), complex numbers (``\\frac{3+4i}{5}`` = 0.6+0.8i), inequalities either way
  round and as intervals (``3>x>-2`` = ``(-2,3)``), numerals with a base (``1011_3`` is not ``1011_2``),
  degree and percent signs (``36°`` = ``36^\\circ``; ``12.5`` for ``12.5\\%``) and several boxes, which
  must agree in value; square roots of rationals (``\\sqrt{12}`` = ``2\\sqrt{3}``, ``\\frac{1}{1+\\sqrt{2}}`` =
  ``\\sqrt{2}-1``), and ``\\pi`` and single letters as unknowns (``(x+2)(x+5)`` = ``x^2+7x+10``: equal rational
  functions, compared at two fixed points where each unknown is a rational), points element by element;
  n-th roots and fractional powers of rationals, powers of e, ``\\ln``, ``\\log_b``, ``\\sin``/``\\cos``/``\\tan``
  of a number, roots and products of letters and binomial coefficients, as sums of monomials built by
  identities only (``6^{3/2}`` = ``6\\sqrt{6}``, ``\\sqrt{9x}`` = ``3x^{1/2}``; wrong where the values plainly
  differ, ``e^{7}`` for ``e^{6}``); flat sets in braces as sets (``\\{2,1\\}`` = ``\\{1,2\\}``).
  In the helpers, a near miss whose parsed value plainly differs from the truth's (30 digits, letters set to one
  positive rational) is answered without sympy's simplify, where math_verify could only say False (``_Apart``),
  and math_verify's LaTeX parser tries ANTLR's SLL prediction before its full LL one (the same parse, faster).

Needs Python >= 3.10 and math_verify (``pip install math-verify==0.9.0``; Linux).  Without them the first call
raises ``MathVerifyUnavailable``, saying what is missing and the line that installs it: a reward that scored
every answer sympy must decide 0 would let a training run learn from zeros.

Command line: ``python new_math_reward.py score FILE.jsonl`` (``--help`` for the options).
TRL: ``GRPOTrainer(..., reward_funcs=trl_reward)``, the dataset's ``ground_truth`` (or ``solution``,
``answer``) column holding the truth; completions plain or conversational.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import importlib.util
import itertools
import json
import math
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import unicodedata
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any, NamedTuple

MIN_PYTHON = (3, 10)  # as math-verify 0.9.0 (and zip(strict=), X | Y in isinstance below)
MATH_VERIFY_REQUIREMENT = "math-verify==0.9.0"  # the release tested with (requirements.txt says why)
DEFAULT_TIMEOUT_S = 1.0
MAX_ANSWER_CHARS = 1000  # a final answer longer than this is not a MATH answer
MAX_BRACE_DEPTH = 30
MAX_SCAN_CHARS = 20_000  # where the final \boxed{} is looked for (tail of the response)
MAX_THINK_CHARS = 200_000
MAX_POW_EXPONENT = 1e6  # a numeric power with a bigger exponent is too large to verify in time
MAX_FACTORIAL = 10_000
WORKER_MEMORY_LIMIT = 4 << 30
ZYGOTE_STARTUP_TIMEOUT_S = 60.0  # a zygote that has not imported math_verify by then is replaced
FAST_SLICE_S = 0.1  # CPU an answer uses before it can be made to wait for answers that have had less
QUANTUM_S = 0.05  # after that, it yields its place to one that has had this much less CPU
BATCH_THREADS_PER_WORKER = 4
WORKER_GOLDS = 1024  # truths a worker is remembered to have parsed (its parse cache holds 4096 strings)
MAX_LIVE_WORKERS = 64  # running and waiting workers at most (per pool: at least 8 per running place)
WALL_BACKSTOP_FACTOR = 60  # an answer still unanswered after this many bounds of wall time is given up
MAX_ATTEMPTS = 8  # helper deaths under one answer before it is taken for one that crashes them
MAX_STARTS = 64  # failed worker starts in a row (the zygote dying) before an answer gives up
PARENT_POLL_S = 0.1  # how often the zygote checks that the caller is still alive
POLL_MAX_S = 0.05
POLL_MIN_S = 0.01

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
FORMAT_TAGS = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
_SERVE_FLAG = "--serve-math-verify-worker"

# Loaders such as verl's may exec this file without registering it in sys.modules, hence
# NamedTuple rather than dataclasses.  Scores are kept in thousandths so totals are exact (0.7 + 0.2 + 0.1 == 1.0).
_ACC_MILLI, _TAG_MILLI, _PENALTY_CAP_MILLI = 700, 50, 100
_COT_FULL_MILLI, _COT_HALF_MILLI = 100, 50

_STEP_RE = re.compile(
    r"^[ \t>*#_-]*(?:step[ \t]*(\d{1,4})[ \t]*[:.]|\((\d{1,4})\)|(\d{1,4})\.(?!\d))",
    re.IGNORECASE | re.MULTILINE,
)
_KEYWORD_RE = re.compile(
    r"\b(?:solve[sd]?|solving|equations?|calculat(?:e|es|ed|ing|ion|ions)|substitut(?:e|es|ed|ing|ion)"
    r"|therefore|because|thus|sums?|products?|derivatives?|integrals?)\b",
    re.IGNORECASE,
)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_OR_RE = re.compile(r"\bor\b", re.IGNORECASE)
_SPACING_RE = re.compile(r"\\left\b|\\right\b|\\[!,;: ]|~|\s+")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\d)")
_NUM_TOKEN_RE = re.compile(r"\s*(\d+(?:\.\d+)?|\\cdot|\\times|[-+*/^(){}])")


# ---------------------------------------------------------------- answer extraction


def _brace_end(text: str, open_at: int) -> int:
    """Index just past the brace matching text[open_at] == '{', or -1 when unbalanced."""
    depth = 0
    for m in re.finditer(r"[{}]", text[open_at:]):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return open_at + m.end()
    return -1


def _boxed_spans(text: str) -> list[tuple[int, int]]:
    """Top-level ``\\boxed{...}`` contents of text as (start, end) spans, in order."""
    closers: dict[int, int] = {}
    stack: list[int] = []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            closers[stack.pop()] = m.start()
    spans: list[tuple[int, int]] = []
    last_end = -1
    for m in _BOXED_RE.finditer(text):
        brace = m.end() - 1
        if brace < last_end or brace not in closers:
            continue
        spans.append((brace + 1, closers[brace]))
        last_end = closers[brace]
    return spans


_TRAILING = ".,;"  # punctuation a sentence puts after its answer (not "!": 5! is 120)


def _strip_math(s: str) -> str:
    """Drop math delimiters and trailing punctuation around an answer ($7$. is 7)."""
    s = s.strip().rstrip(_TRAILING).strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    return s.rstrip(".").strip()


# ---------------------------------------------------------------- the shapes of an unboxed answer block
#
# The chat template asks for \boxed{} inside <answer>, but a policy early in training writes the bare
# expression, a $...$ or \(...\) span, a sentence around it ("The answer is 7.", "so x = 5"), a thousands
# separator or a bmatrix.  The block is reduced to the one expression it states, which is then judged like a
# boxed one; a block that still reads as prose after that is handed to math_verify as it was.

_MATH_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_LEAD_IN_RE = re.compile(
    r"^(?:(?:so|thus|therefore|hence|then|finally|overall|altogether|in\s+(?:conclusion|summary|total))\b[,:]?"
    r"|(?:the\s+|my\s+|our\s+)?(?:final\s+|correct\s+)?answer\s*(?:is\b|=|:)?"
    r"|(?:we\s+(?:get|have|find|obtain)|it\s+is|this\s+gives|which\s+gives)\b:?"
    r"|answer:|\*\*answer:?\*\*:?)\s*",
    re.IGNORECASE,
)
_CUE_RE = re.compile(
    r"(?:\b(?:is|are|equals?|gives?|get|obtain|find|so|thus|therefore|hence)|[=:])\s*$", re.I
)
_PROSE_RE = re.compile(
    r"(?<![\\a-zA-Z{])(?!sqrt(?![a-zA-Z]))[a-zA-Z]{3,}(?![a-zA-Z}])"
)  # an English word, not \frac or \text{cm}, nor sqrt (plain-text math, see _plain)
_LAST_COPULA_RE = re.compile(r"^.*\b(?:is|are|equals|was|be)\s+", re.IGNORECASE | re.DOTALL)
# a number and its unit: 12 ways, 5 cm, 3 m
_PLAIN_UNIT_RE = re.compile(r"^(.*?[\d}])\s+((?:square\s+|cubic\s+)?(?:[a-zA-Z]{2,}|[mgsh])\.?)$")
_PLAIN_MIXED_RE = re.compile(r"^(-?\d+)\s+(\d+)/(\d+)$")  # 2 1/2
_DELIMITERS_RE = re.compile(r"^\s*(?:\$\$|\$|\\\)|\\\])|(?:\$\$|\$|\\\(|\\\[)\s*$")
_SEPARATOR = r"(?:,|\{,\}|,\\!|\\,|\\!|\\ |\\;|~| )"
_THOUSANDS_RE = re.compile(rf"[-+]?\d{{1,3}}(?:{_SEPARATOR}\d{{3}})+(?:\.\d+)?")
_SEPARATOR_RE = re.compile(_SEPARATOR)
_MATRIX_ENV_RE = re.compile(
    r"\\(begin|end)\{(?:bmatrix|Bmatrix|matrix|smallmatrix)\}"
)  # not vmatrix: a determinant
_DENOMINATORS = {"half": 2, "halve": 2, "third": 3, "quarter": 4, "fourth": 4, "fifth": 5, "sixth": 6}
_DENOMINATORS |= {"seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10}
_POWER_WORDS = {"squared": "^2", "cubed": "^3", "factorial": "!"}
# words after a number that change its value: 5 squared is not 5 units of anything, two thirds is not 2
_VALUE_WORD_RE = re.compile(
    rf"(?:{'|'.join([*_POWER_WORDS, *_DENOMINATORS])})s?\.?$|pi$", re.IGNORECASE
)  # 5 pi is 5\pi, not 5 units of pi


def _canonical(s: str) -> str:
    """One spelling for shapes that mean the same value: 1,\\!000 is 1000, a bmatrix is a pmatrix."""
    s = s.strip()
    if _THOUSANDS_RE.fullmatch(s):
        s = _SEPARATOR_RE.sub("", s)
    mixed = _PLAIN_MIXED_RE.fullmatch(s)
    if mixed is not None:
        s = f"{mixed.group(1)}\\frac{{{mixed.group(2)}}}{{{mixed.group(3)}}}"
    s = _MATRIX_ENV_RE.sub(lambda m: f"\\{m.group(1)}{{pmatrix}}", s)
    unit = _PLAIN_UNIT_RE.fullmatch(s)
    if unit is not None and not _PROSE_RE.search(unit.group(1)):
        number, word = unit.group(1), unit.group(2).rstrip(".").lower()
        if word in _POWER_WORDS:  # 5 squared is 25, 3 factorial 6: not a unit
            s = (number if number.isdigit() else f"({number})") + _POWER_WORDS[word]
        elif number.lstrip("-").isdigit() and word.removesuffix("s") in _DENOMINATORS:  # 2 thirds is 2/3
            sign = "-" if number.startswith("-") else ""
            s = f"{sign}\\frac{{{number.lstrip('-')}}}{{{_DENOMINATORS[word.removesuffix('s')]}}}"
        elif not _VALUE_WORD_RE.match(word):
            s = f"{number}\\text{{ {unit.group(2).rstrip('.')}}}"  # the unit the truth may imply
    return s


def _lead_in(text: str) -> str:
    """text without the words a sentence puts before its answer (The answer is, So, Therefore, ...)."""
    text = text.replace("**", "").replace("`", "").strip()
    while True:
        m = _LEAD_IN_RE.match(text)
        if m is None or not m.group():
            return text
        text = text[m.end() :].strip()


# ---------------------------------------------------------------- words, numbers in words, several solutions
#
# "Monday", "odd", "no solution" are read as \text{...}; "twelve", "twenty-four", "eight ways" as numbers;
# "1 or 2", "x=1 or x=2", "$-2$ and $3$" as the set of solutions, written 1 \text{ or } 2 (what math_verify reads
# as {1, 2}).  The verdicts on them (a word against a word, a set against a set, exact values) are in the caller.

_UNIT_NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    " sixteen seventeen eighteen nineteen"
).split()
_NUMBER_WORDS = {word: n for n, word in enumerate(_UNIT_NUMBERS)}
_TENS_WORDS = {
    word: 10 * n for n, word in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)
}
_SCALE_WORDS = {"thousand": 10**3, "million": 10**6, "billion": 10**9}
_NUMBER_TOKENS = [*_NUMBER_WORDS, *_TENS_WORDS, *_SCALE_WORDS, "hundred", "and", "minus", "negative"]
_NUMBER_TOKEN_RE = re.compile("|".join(sorted(_NUMBER_TOKENS, key=len, reverse=True)))  # seventeen, not seven


def _spelled_value(words: list[str]) -> int | None:
    """The integer a number written in words stands for (twelve, twenty four, one hundred and five), else None."""
    sign = -1 if words[:1] in (["minus"], ["negative"]) else 1
    words = words[1:] if sign < 0 else words
    if words == ["zero"]:
        return 0
    total, current, last, cap = 0, 0, None, math.inf
    for i, word in enumerate(words):
        if word == "and":  # one hundred and five
            if last not in ("hundred", "scale") or i == len(words) - 1:
                return None
        elif 0 < _NUMBER_WORDS.get(word, 0) < 10:
            if last not in (None, "tens", "hundred", "scale"):
                return None
            current, last = current + _NUMBER_WORDS[word], "unit"
        elif word in _NUMBER_WORDS and word != "zero" or word in _TENS_WORDS:
            if last not in (None, "hundred", "scale"):
                return None
            current += _NUMBER_WORDS.get(word) or _TENS_WORDS[word]
            last = "tens" if word in _TENS_WORDS else "teen"
        elif word == "hundred":
            if last != "unit" or current >= 10:
                return None
            current, last = current * 100, "hundred"
        elif word in _SCALE_WORDS:
            if not current or _SCALE_WORDS[word] >= cap:
                return None
            total, current, cap, last = total + current * _SCALE_WORDS[word], 0, _SCALE_WORDS[word], "scale"
        else:
            return None
    return sign * (total + current) if last is not None else None


_WORD = r"[a-zA-Z]+(?:['-][a-zA-Z]+)*"  # odd, twenty-four, Euler's
_WORDS_RE = re.compile(rf"{_WORD}(?:\s+{_WORD}){{0,3}}")  # at most four words
_ARTICLE_RE = re.compile(r"^(?:a|an|the)\s+", re.IGNORECASE)


def _word_answer(text: str) -> str | None:
    """A number in words as digits (a unit word after it kept), a phrase of at most 4 words as \\text{...}."""
    text = _ARTICLE_RE.sub("", text.strip())
    if not _WORDS_RE.fullmatch(text):
        return None
    words = re.split(r"[\s-]+", text.lower())
    value = _spelled_value(words)
    if value is not None:
        return str(value)
    unit = words[-1]
    number_word = unit in _NUMBER_WORDS or unit in _TENS_WORDS or unit in _SCALE_WORDS or unit == "hundred"
    if len(words) > 1 and not number_word and (value := _spelled_value(words[:-1])) is not None:
        return _canonical(f"{value} {text.split()[-1]}")  # eight ways, five squared, two thirds
    return f"\\text{{{text}}}"


_JOIN_RE = re.compile(r"\b(?:or|and)\b", re.IGNORECASE)  # the spaces and comma around it are stripped apart
_TEXT_JOIN_RE = re.compile(r"\\(?:text|textrm|mbox|mathrm)\{\s*(or|and)\s*\}|\\q?quad\b", re.IGNORECASE)
_HEAD_COPULA_RE = re.compile(r"^.*\b(?:is|are|equals?|was|were|be)\s+", re.IGNORECASE | re.DOTALL)
_VARIABLE_SET_RE = re.compile(r"^([a-zA-Z]|\\[a-zA-Z]+)\s*=\s*(.+)$", re.DOTALL)  # x = 5, \theta = 2


def _top_level(text: str, comma_needs_space: bool) -> list[str] | None:
    """text cut at its commas outside brackets (only ", " when comma_needs_space: 1,000 stays whole)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and not depth and (not comma_needs_space or text[i + 1 : i + 2].isspace()):
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]] if depth == 0 else None


def _solutions(text: str) -> tuple[str, bool] | None:
    """Several solutions joined by or / and (1 or 2, x=1 or x=2, $-2$ and $3$) as one answer, 1 \\text{ or } 2,
    and whether it is ambiguous (values of several unknowns); None when text is not such a list."""
    lowered = text.lower()
    if "or" not in lowered and "and" not in lowered:
        return None
    text = _TEXT_JOIN_RE.sub(lambda m: f" {m.group(1) or ''} ", text)
    first = _JOIN_RE.search(text)
    if first is None:
        return None
    head = _HEAD_COPULA_RE.match(text[: first.start()])  # The solutions are $-2$ and $3$
    text = text[head.end() :] if head else text
    if _spelled_value(re.split(r"[\s-]+", _strip_math(text).lower())) is not None:
        return None  # one hundred and five: one number
    items, variables, named = [], set(), []
    for part in _JOIN_RE.split(text):
        pieces = _top_level(part.strip().removesuffix(","), comma_needs_space=True)  # 1, 2, or 3
        if pieces is None:
            return None
        for item in map(_strip_math, pieces):
            spelled = _spelled_value(re.split(r"[\s-]+", item.lower())) if _WORDS_RE.fullmatch(item) else None
            item = str(spelled) if spelled is not None else item
            assigned = _VARIABLE_SET_RE.match(item)
            if assigned is not None:
                variables.add(assigned.group(1))
                item = _strip_math(assigned.group(2))
                named.append(f"{assigned.group(1)}={_canonical(item)}")
            item = _canonical(item)
            if not item or _PROSE_RE.search(item) or "=" in item or _RELATION_RE.search(item):
                return None
            items.append(item)
    if len(items) < 2:
        return None
    joins = {join.lower() for join in _JOIN_RE.findall(text)}
    if joins == {"and"} and len(variables) == len(named) == len(items):
        return ", ".join(named), False  # x = 2 and y = 3: a tuple written out, x=2, y=3
    # x = 2 or y = 7 gives the values of two unknowns: which one is the answer is not said
    return " \\text{ or } ".join(items), len(variables) > 1


def _block_answer(block: str) -> _Answer:
    """The one answer an unboxed <answer> block states, whatever its shape."""
    ambiguous = bool(_OR_RE.search(block))
    if _BOXED_RE.search(
        block
    ):  # a box left open (\\boxed{1): nothing to cut out; math_verify reads it as written
        return _Answer(_strip_math(block) or None, False, ambiguous)
    text = _lead_in(block.strip().rstrip(_TRAILING))
    solutions = _solutions(text)  # 1 or 2, x=1 or x=2, $1$ and $2$: one answer, the set of them
    if solutions is not None:
        return _Answer(solutions[0], True, solutions[1])
    spans = [(m.start(g), m.end(g)) for m in _MATH_SPAN_RE.finditer(text) for g in range(1, 5) if m.group(g)]
    if len(spans) > 1 and "=" in text:  # $x=2$, $y=3$: one tuple written out, not spans that disagree
        written = _canonical(_strip_math(_MATH_SPAN_RE.sub(lambda m: next(g for g in m.groups() if g), text)))
        if _assignments(_norm(written)) is not None:
            return _Answer(written, True, ambiguous)
    if spans:
        agree, others = _agree(text, spans)
        # "Since $x=2$, the value of $k$ is $7$": after a cue the last span is the answer, else all must agree
        if len(spans) > 1 and (others or not agree):
            if _CUE_RE.search(_DELIMITERS_RE.sub("", text[spans[-2][1] : spans[-1][0]])):
                agree, others = True, ()
        answer = _canonical(_strip_math(text[spans[-1][0] : spans[-1][1]]))
        return _Answer(answer or None, True, ambiguous or not agree, others)
    plain = _strip_math(text)
    if _PROSE_RE.search(_canonical(plain)):  # "The smallest such number is 7": what follows the verb
        plain = _LAST_COPULA_RE.sub("", plain)
    answer = _canonical(_strip_math(plain))
    if not answer:
        return _Answer(None, False, ambiguous)
    if _PROSE_RE.search(answer):
        words = _word_answer(answer)  # Monday, no solution, twelve, eight ways
        if words is not None:
            return _Answer(words, True, ambiguous)
        # still a sentence: math_verify reads it as written, as before
        return _Answer(_strip_math(block) or None, False, ambiguous)
    return _Answer(answer, True, ambiguous)


def _norm(s: str) -> str:
    """Spelling-level normalisation: equal results are certainly the same answer."""
    s = _strip_math(s)
    s = _SPACING_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    if _NORM_THOUSANDS_RE.fullmatch(s):
        s = s.replace("{,}", "").replace(",", "")
    s = _MATRIX_ENV_RE.sub(lambda m: f"\\{m.group(1)}{{pmatrix}}", s)
    s = s.removeprefix("\\$").removeprefix("\\text{\\$}")
    s = _unicode(s).replace("^{\\circ}", "^\\circ").replace("\\degree", "^\\circ")
    s = s.replace("\\text{degrees}", "^\\circ").replace("\\text{degree}", "^\\circ")
    s = s.replace("\\text{percent}", "\\%").replace("\\mathrm{i}", "i").replace("\\text{i}", "i")
    return _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s).rstrip(".")


_NORM_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?")
_UNICODE = {"−": "-", "×": "\\times", "·": "\\cdot", "÷": "\\div", "π": "\\pi", "°": "^\\circ"}
_UNICODE |= {
    "≤": "\\le",
    "≥": "\\ge",
    "∞": "\\infty",
    "±": "\\pm",
    "∓": "\\mp",
    "≠": "\\ne",
    "⁄": "/",
    "∕": "/",
}
_UNICODE |= {
    "∪": "\\cup",
    "∩": "\\cap",
    "∈": "\\in",
    "∅": "\\emptyset",
    "⋅": "\\cdot",
    "∙": "\\cdot",
    "√": "\\sqrt",
}
_UNICODE |= {"θ": "\\theta", "α": "\\alpha", "β": "\\beta", "γ": "\\gamma", "λ": "\\lambda", "φ": "\\phi"}
_VULGAR = "½⅓⅔¼¾⅕⅖⅗⅘⅙⅚⅐⅛⅜⅝⅞⅑⅒"  # each the fraction unicodedata.numeric names: ½ is 1/2
_UNICODE |= {
    c: "\\frac{{{0.numerator}}}{{{0.denominator}}}".format(
        Fraction(unicodedata.numeric(c)).limit_denominator(10)
    )
    for c in _VULGAR
}
# str.maketrans, not zip(strict=): the file must import under an old Python to say at the first call what it needs
_SUPERSCRIPTS, _SUBSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻ⁿⁱˣ", "₀₁₂₃₄₅₆₇₈₉"
_SCRIPT_DIGITS = str.maketrans(_SUPERSCRIPTS + _SUBSCRIPTS, "0123456789+-nix0123456789")
_UNICODE_RE = re.compile(
    "|".join(map(re.escape, _UNICODE)) + f"|[{_SUPERSCRIPTS}]+|[{_SUBSCRIPTS}]+|[\uff01-\uff5e]|[∛∜]"
)
# what a root sign applies to when no bracket follows it: a number, a letter, a command (√2, 2√3, √x, √\pi)
_ROOT_OPERAND_RE = re.compile(r"\s*(\d+(?:\.\d+)?|[a-zA-Z]|\\[a-zA-Z]+)")


def _unicode_sign(m: re.Match) -> str:
    c = m.group()
    if c[0] in _SUPERSCRIPTS:
        return "^{" + c.translate(_SCRIPT_DIGITS) + "}"
    if c[0] in _SUBSCRIPTS:
        return "_{" + c.translate(_SCRIPT_DIGITS) + "}"
    if c in "∛∜":
        return "\\sqrt[3]" if c == "∛" else "\\sqrt[4]"
    if "\uff01" <= c <= "\uff5e":  # full-width ASCII: ７ is 7
        return chr(ord(c) - 0xFEE0)
    latex = _UNICODE[c]
    after = m.string[m.end() : m.end() + 1]
    return latex + " " if latex[-1].isalpha() and latex[0] == "\\" and after.isalpha() else latex


def _roots(s: str) -> str:
    """\\sqrt (from √) followed by (...) or a bare operand gets braces: √(x+1), √2, 2√3 are \\sqrt{...}."""
    out, i = [], 0
    for m in re.finditer(r"\\sqrt(?:\[\d\])?(?![a-zA-Z])", s):
        if m.start() < i:
            continue
        out.append(s[i : m.end()])
        i = m.end()
        rest = s[i:]
        if rest[:1] == "(":
            depth = 0
            for j, ch in enumerate(rest):
                depth += ch == "("
                depth -= ch == ")"
                if depth == 0:
                    out.append("{" + rest[1:j] + "}")
                    i += j + 1
                    break
        elif rest[:1] != "{":
            operand = _ROOT_OPERAND_RE.match(rest)
            if operand is not None:
                out.append("{" + operand.group(1) + "}")
                i += operand.end()
    return "".join(out) + s[i:]


# plain-text math, as a calculator or a program writes it: sqrt(3), 2*sqrt(3), pi/2, 1e3, 2.5E-4
_PLAIN_HINT_RE = re.compile(r"sqrt|pi|[\d.][eE]")
_NAMED = r"(?<![\\a-zA-Z])(?<!\\operatorname\{)(?<!\\mathrm\{)(?<!\\text\{)"  # not \pi, spin, \text{pi}
_PLAIN_SQRT_RE = re.compile(_NAMED + r"sqrt(?![a-zA-Z])")
_PLAIN_PI_RE = re.compile(_NAMED + r"pi(?![a-zA-Z])")
_PLAIN_EXPONENT_RE = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d{1,4})(?![\w.])")
MAX_PLAIN_EXPONENT = 30  # 1e30 is written out in digits; a larger exponent stays a power of ten


def _exponent(m: re.Match) -> str:
    """1e3 as 1000, 2.5E-4 as 0.00025 (what the digits say, exactly); 1e400 as 1\\times10^{400}."""
    mantissa, exponent = m.group(1), int(m.group(2))
    if abs(exponent) > MAX_PLAIN_EXPONENT:
        return f"{mantissa}\\times10^{{{exponent}}}"
    digits = mantissa.replace(".", "")
    point = (mantissa.index(".") if "." in mantissa else len(mantissa)) + exponent
    if point <= 0:
        digits, point = "0" * (1 - point) + digits, 1
    digits = digits + "0" * (point - len(digits))
    whole, fraction = digits[:point].lstrip("0") or "0", digits[point:].rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def _plain(s: str) -> str:
    """The LaTeX for plain-text math: sqrt(3) and sqrt 3 are \\sqrt{3}, pi is \\pi, 1e3 is 1000."""
    if not _PLAIN_HINT_RE.search(s):
        return s
    s = _PLAIN_EXPONENT_RE.sub(_exponent, s)
    s = _PLAIN_PI_RE.sub(lambda m: "\\pi " if s[m.end() : m.end() + 1].isalpha() else "\\pi", s)
    if _PLAIN_SQRT_RE.search(s):
        s = _roots(_PLAIN_SQRT_RE.sub(lambda m: "\\sqrt", s))
    return s


def _unicode(s: str) -> str:
    """The LaTeX for the Unicode and plain-text math models write, answers and truths alike: 36°, −2, 3×4, π, ≤,
    ½, √2, 2√3, √(x+1), x², x⁻¹, 1011₂, ７; sqrt(3), pi/2, 1e3 (see _plain)."""
    if not s.isascii():
        had_root = "√" in s or "∛" in s or "∜" in s
        s = _UNICODE_RE.sub(_unicode_sign, s)
        s = _roots(s) if had_root else s
    return _plain(s)


class _Answer(NamedTuple):
    text: str | None  # the candidate answer; None when there is none
    boxed: bool  # came from \boxed{} (math_verify gets it wrapped again)
    ambiguous: bool  # offers several different values
    others: tuple[str, ...] = ()  # other boxes only sympy can compare with this one: all must equal it
    scope: str = (
        ""  # the text the answer is stated in (the block, or the final box's line): where hedges are read
    )


MAX_BOX_SPELLINGS = 8  # more differently written boxes than this is not one answer
MAX_ANSWER_BLOCKS = 64  # more <answer> blocks than this is not one answer


def _agree(text: str, spans: list[tuple[int, int]]) -> tuple[bool, tuple[str, ...]]:
    """(agree, others): boxes are one answer when equal in value; others are left for sympy to compare."""
    return _agree_values([text[a:b] for a, b in spans])


def _agree_values(answers: list[str]) -> tuple[bool, tuple[str, ...]]:
    """(agree, others): final answers (boxes, <answer> blocks) are one answer when each equals the last in value;
    others are left for sympy to compare."""
    last = _norm(answers[-1])
    spellings = {_norm(a) for a in answers[:-1]} - {last}
    if len(spellings) > MAX_BOX_SPELLINGS:
        return False, ()
    others = []
    for box in sorted(spellings):
        verdict = fast_verdict(box, (last,))
        if verdict is not True:  # either may be read as the truth: 1011 and 1011_2 agree both ways
            other_way = fast_verdict(last, (box,))
            verdict = True if other_way else verdict if other_way is False else None
        if verdict is False or verdict is None and (is_hostile(box) or is_hostile(last)):
            return False, ()
        if verdict is None:
            others.append(box)
    return True, tuple(others)


# a sentence that takes back what came before it: the boxes before it are not the answer
_CORRECTION_RE = re.compile(
    r"(?:^|(?<=[.!?;:])|\n)[ \t]*(?:(?:wait|actually|oops|hmm+|correction|sorry|on second thought"
    r"|i made an? (?:error|mistake)|let me (?:re-?check|recalculate|recompute|redo|double[- ]check|correct))\b|no,)",
    re.IGNORECASE,
)


def _one_block(block: str) -> _Answer:
    """The answer one ``<answer>`` block states."""
    if len(block) > MAX_SCAN_CHARS:
        return _Answer(None, False, False)
    spans = _boxed_spans(block)
    if spans:
        a, b = spans[-1]
        agree, others = _agree(block, spans)
        return _Answer(block[a:b], True, not agree, others, block)
    return _block_answer(block)._replace(scope=block)


def _earlier_blocks(response: str, end: int) -> list[str]:
    """The closed ``<answer>`` blocks before response[end:] that compete with the last one: those after the
    reasoning (a block quoted inside <think> does not count) and after the last correction before it."""
    t_close = response.rfind(THINK_CLOSE, 0, end)
    start = max(t_close + len(THINK_CLOSE) if t_close >= 0 else 0, end - MAX_SCAN_CHARS)
    if response.find(ANSWER_OPEN, start, end) < 0:
        return []
    for cue in _CORRECTION_RE.finditer(response, start, end):
        start = cue.end()
    blocks = []
    while len(blocks) <= MAX_ANSWER_BLOCKS:
        a_open = response.find(ANSWER_OPEN, start, end)
        if a_open < 0:
            break
        a_close = response.find(ANSWER_CLOSE, a_open, end)
        if a_close < 0:
            break
        blocks.append(response[a_open + len(ANSWER_OPEN) : a_close])
        start = a_close + len(ANSWER_CLOSE)
    return blocks


def extract_answer(response: str) -> _Answer:
    """The final answer: the ``<answer>`` block if any, else the last ``\\boxed{}`` after the reasoning.  Several
    blocks are one answer only when they agree in value, as several boxes are: <answer>3</answer><answer>4</answer>
    offers two."""
    a_open = response.rfind(ANSWER_OPEN)
    if a_open >= 0:
        start = a_open + len(ANSWER_OPEN)
        a_close = response.find(ANSWER_CLOSE, start)
        answer = _one_block(response[start : a_close if a_close >= 0 else len(response)])
        if answer.text is None or answer.ambiguous:
            return answer
        earlier = [_one_block(block) for block in _earlier_blocks(response, a_open)]
        if len(earlier) > MAX_ANSWER_BLOCKS or any(e.ambiguous for e in earlier):
            return answer._replace(ambiguous=True)
        texts = [e.text for e in earlier if e.text is not None]  # an empty block offers no value
        if texts:
            agree, others = _agree_values([*texts, answer.text])
            answer = answer._replace(ambiguous=not agree, others=tuple(sorted({*answer.others, *others})))
        return answer
    t_close = response.rfind(THINK_CLOSE)
    region = response[t_close + len(THINK_CLOSE) :] if t_close >= 0 else response
    region = region[-MAX_SCAN_CHARS:]
    spans = _boxed_spans(region)
    if not spans:
        return _Answer(None, False, False)
    a, b = spans[-1]
    # no reasoning marker: only values boxed on the final line compete; and never those taken back before the
    # last box ("First \\boxed{5}. Wait, I made an error. The answer is \\boxed{6}.")
    line_start = region.rfind("\n", 0, a) + 1
    start = line_start if t_close < 0 else 0
    for cue in _CORRECTION_RE.finditer(region, start, a):
        start = cue.end()
    spans = [s for s in spans if s[0] >= start]
    agree, others = _agree(region, spans)
    line_end = region.find("\n", b)
    scope = region[max(line_start, start) : line_end if line_end >= 0 else len(region)]
    return _Answer(region[a:b], True, not agree, others, scope)


# ---------------------------------------------------------------- hedging
#
# An answer that offers more than one value, a range, a bound or an alternative is wrong, unless the truth is
# itself such an object (an inequality, an interval, a set of solutions): "I think it's 4 but maybe 5",
# "3? 4? 5?", "between 4 and 5", "4 to 5", "at least 5", "5 or more", "x \\ge 5" all score 0 for the truth 5.
# A value is a run of math (digits, LaTeX commands, brackets, operators); "probably 5" offers one value.

_VALUE_RUN_RE = re.compile(r"(?:[\d.{}^_+\-*/()\[\]|!]|\\[a-zA-Z]+|\$|\s)+")
_VALUE_MARK_RE = re.compile(r"\d|\\(?:pi|infty)\b|\([A-E]\)")  # what makes a run of math a value
_ALTERNATIVE_RE = re.compile(
    r"\?|\b(?:maybe|perhaps|probably|possibly|likely|alternatively|otherwise|either|or|unsure|not\s+sure"
    r"|(?:might|could|may)\s+(?:also\s+|well\s+)?be|i\s+(?:think|guess|believe|suppose))\b",
    re.IGNORECASE,
)
_BOUND_BEFORE_RE = re.compile(  # before the one value that follows it: at least 5, x \\ge 5, under 5
    r"\b(?:at\s+(?:least|most|minimum|maximum)|(?:no|not)\s+(?:more|less|fewer|greater|smaller|larger|bigger|higher"
    r"|lower)\s+than|(?:more|less|fewer|greater|smaller|larger|bigger|higher|lower)\s+than|up\s+to|above"
    r"|below|exceeds?|exceeding|minimum\s+of|maximum\s+of)\b|\\(?:geqslant|leqslant|geq|leq|ge|le|gt|lt|neq|ne)\b"
    r"|[<>≤≥≠]",
    re.IGNORECASE,
)
_BOUND_AFTER_RE = re.compile(  # after the value it bounds, with nothing after: 5 or more, 5 at least, 5+
    r"(?:\b(?:or|and)\s+(?:more|less|fewer|greater|smaller|larger|higher|lower|above|below|up|over|under|so)"
    r"|\bat\s+(?:least|most)|\bor\s+thereabouts|\+)\W*$",
    re.IGNORECASE,
)
_RANGE_BEFORE_RE = re.compile(r"\bbetween\b", re.IGNORECASE)  # followed by 2 values: between 4 and 5
_RANGE_JOIN_RE = re.compile(r"^\s*(?:to|through|until|till|–|—|\\text\{\s*to\s*\}|\\sim|\\to)\s*$", re.I)
_SEVERAL_TRUTH_RE = re.compile(  # a truth that is itself several values, a range or a bound
    r"\\(?:pm|mp|cup|cap|infty|in|le|ge|leq|geq|lt|gt)(?![a-zA-Z])|\\text\{\s*(?:or|and)\s*\}|\\\{|[<>≤≥;]|,(?!\d{3})"
    r"|\b(?:or|and)\b"
)
MAX_HEDGE_SCOPE = 2_000  # a longer block is prose; the answer rules above already handle it


def _value_runs(text: str) -> list[re.Match]:
    return [m for m in _VALUE_RUN_RE.finditer(text) if _VALUE_MARK_RE.search(m.group())]


def _hedged(scope: str) -> bool:
    """True when the text an answer is stated in offers several values, a range, a bound or an alternative."""
    scope = _unicode(scope[-MAX_HEDGE_SCOPE:])
    segments = {
        tuple(_SPACING_RE.sub("", m.group()).strip("$()[].") for m in _value_runs(part))
        for part in _ALTERNATIVE_RE.split(scope)
    }
    if len(segments - {()}) > 1:  # I think it's 4 but maybe 5; 3? 4? 5?
        return True
    runs = _value_runs(scope)
    if not runs:
        return False
    for bound in _BOUND_BEFORE_RE.finditer(scope):
        if len(_value_runs(scope[bound.end() :])) == 1:  # the answer's value, bounded: at least 5, \\geq 5
            return True
    if _BOUND_AFTER_RE.search(scope, runs[-1].start()):  # 5 or more, 5+: nothing after it
        return True
    for lead in _RANGE_BEFORE_RE.finditer(scope):
        if len(_value_runs(scope[lead.end() :])) == 2:  # between 4 and 5
            return True
    return len(runs) >= 2 and bool(_RANGE_JOIN_RE.match(scope[runs[-2].end() : runs[-1].start()]))


def _several_allowed(truths: tuple[str, ...], normed: tuple[str, ...] | None = None) -> bool:
    """The truth is itself several values, an interval or an inequality: answers of that kind are judged.
    normed: the truths through _norm, where already worked out."""
    normed = normed if normed is not None else tuple(_norm(t) for t in truths)
    return any(
        _SEVERAL_TRUTH_RE.search(_unicode(t)) or _interval(n) is not None
        for t, n in zip(truths, normed, strict=True)
    )


# ---------------------------------------------------------------- format and chain of thought


def format_milli(response: str) -> int:
    """Format score in thousandths (0..200)."""
    pos = [response.find(t) for t in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)]
    for earlier, later in ((0, 1), (1, 2), (2, 3)):
        if pos[earlier] >= 0 and pos[later] >= 0 and pos[later] < pos[earlier]:
            return 0
    milli = sum(_TAG_MILLI for tag in FORMAT_TAGS if response.count(tag) == 1)
    if pos[0] >= 0:
        milli -= min(_PENALTY_CAP_MILLI, len(response[: pos[0]].strip()))
    last_close = response.rfind(ANSWER_CLOSE)
    if last_close >= 0:
        milli -= min(_PENALTY_CAP_MILLI, len(response[last_close + len(ANSWER_CLOSE) :].strip()))
    return max(0, milli)


def cot_milli(response: str) -> int:
    """Chain-of-thought score in thousandths (0, 50 or 100) from the numbered steps inside <think>."""
    t_open = response.find(THINK_OPEN)
    if t_open < 0:
        return 0
    start = t_open + len(THINK_OPEN)
    t_close = response.find(THINK_CLOSE, start)
    think = response[start : t_close if t_close >= 0 else len(response)][:MAX_THINK_CHARS]
    marks = list(_STEP_RE.finditer(think))
    expected, keyword_steps = 1, 0
    for i, m in enumerate(marks):
        body = think[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(think)]
        if len(body.strip()) <= 3:
            continue
        number = int(next(g for g in m.groups() if g is not None))
        if number != expected:
            break
        expected += 1
        keyword_steps += bool(_KEYWORD_RE.search(body))
    steps = expected - 1
    if steps >= 3 and keyword_steps >= 2:
        return _COT_FULL_MILLI
    if steps >= 2 and keyword_steps >= 1:
        return _COT_HALF_MILLI
    return 0


# ---------------------------------------------------------------- cheap verdicts and hostile input


class _Value(NamedTuple):
    re: Fraction
    im: Fraction
    exact: bool  # no finite decimal in it (math_verify compares decimals after rounding)


_PERIODS = (  # how the repeating digits of a decimal are marked: 0.1\overline{6}, 0.1\bar{6}, 0.1\dot{6}, 0.1(6)
    r"\\(?:overline|bar)\{(\d+)\}",
    r"\\(?:overline|bar)(\d)",
    r"\\dot\{(\d)\}(\d*)\\dot\{(\d)\}",
    r"\\dot\{(\d)\}",
    r"\((\d+)\)",
)
_REPEATING_RE = re.compile(r"(\d*)\.(\d*)(?:" + "|".join(_PERIODS) + ")")
# _norm drops spaces: x\cdot y and \pi r arrive as x\cdoty and \pir, so a letter may follow those four commands
_EXACT_TOKEN_RE = re.compile(
    r"(\d+\.\d+|\d+|\.\d+)|(\\(?:frac|sqrt)(?![a-zA-Z])|\\(?:cdot|times|div|pi)|[-+*/^(){}]|i(?![a-zA-Z])|[a-df-hj-z](?![a-zA-Z({]))"
)
_MAX_EXACT_POWER = 64
MAX_EXACT_BITS = 4096
MAX_SURD_TERMS = 16  # a value with more distinct square roots than this is left to sympy
MAX_RADICAND = 10**9  # \sqrt{n}: n's square part is found by trial division up to 1000, exact below 10^9
_SMALL_PRIMES = [p for p in range(2, 1000) if all(p % q for q in range(2, math.isqrt(p) + 1))]
# Letters (not e: Euler's number, nor i) and \pi are indeterminates: two answers built from them by + - * / and
# whole powers are the same rational function when they agree at two unrelated points, where each stands for
# an arbitrary rational (pi is transcendental, so an identity in pi holds only as an identity in a variable).
_POINTS = {
    name: (Fraction(1009 + 7919 * k, 97 + 2 * k), Fraction(-(7927 + 104_729 * k), 331 + 6 * k))
    for k, name in enumerate([*"abcdfghjklmnopqrstuvwxyz", "\\pi"], start=1)
}

# A value: {squarefree radicand m: complex rational coefficient of sqrt(m)}, {} for zero; 1 for the rational part.
_Surd = dict[int, tuple[Fraction, Fraction]]
_ONE: _Surd = {1: (Fraction(1), Fraction(0))}


def _rational(x: _Surd) -> tuple[Fraction, Fraction] | None:
    """x as a complex rational, None when it holds a square root."""
    if not x:
        return Fraction(0), Fraction(0)
    return x.get(1) if len(x) == 1 else None


def _sadd(x: _Surd, y: _Surd, sign: int) -> _Surd:
    out = dict(x)
    for m, (a, b) in y.items():
        c, d = out.get(m, (_ZERO, _ZERO))
        coef = _small((c + a, d + b) if sign > 0 else (c - a, d - b))
        if coef[0] or coef[1]:
            out[m] = coef
        else:
            out.pop(m, None)
    if len(out) > MAX_SURD_TERMS:
        raise ValueError("too many square roots")
    return out


def _smul(x: _Surd, y: _Surd) -> _Surd:
    out: _Surd = {}
    for m1, c1 in x.items():
        for m2, c2 in y.items():
            g = math.gcd(m1, m2)  # sqrt(m1) sqrt(m2) = g sqrt(m1 m2 / g^2), squarefree again
            term = _cmul(c1, c2)
            out = _sadd(out, {(m1 // g) * (m2 // g): (term[0] * g, term[1] * g)}, 1)
    return out


def _sdiv(x: _Surd, y: _Surd) -> _Surd:
    """x / y; y holds at most two square roots (its conjugate clears them), else ValueError."""
    if not y:
        raise ValueError("division by zero")
    if len(y) == 2:  # (u + v)(u - v) = u^2 - v^2 has no square root left
        (m1, c1), (m2, c2) = y.items()
        conjugate = {m1: c1, m2: (-c2[0], -c2[1])}
        return _sdiv(_smul(x, conjugate), _smul(y, conjugate))
    if len(y) != 1:
        raise ValueError("not an exact division")
    ((m, c),) = y.items()  # x / (c sqrt(m)) = x sqrt(m) / (c m)
    return _smul(x, {m: _cdiv((Fraction(1), Fraction(0)), (c[0] * m, c[1] * m))})


def _sqrt(q: Fraction) -> _Surd:
    """sqrt(q) for a rational q >= 0, its radicand squarefree: sqrt(12) = 2 sqrt(3)."""
    if q < 0:
        raise ValueError("the square root of a negative number is left to math_verify")
    n = q.numerator * q.denominator  # sqrt(n/d) = sqrt(n d) / d
    if not n:
        return {}
    if n >= MAX_RADICAND:
        raise ValueError("radicand too large to factor here")
    square, free = 1, 1
    for p in _SMALL_PRIMES:
        if p * p > n:
            break
        while n % (p * p) == 0:
            n //= p * p
            square *= p
        if n % p == 0:
            n //= p
            free *= p
    root = math.isqrt(n)  # what is left has no factor below 1000 and is below 10^9: a prime, two, or a square
    if root * root == n:
        square *= root
    else:
        free *= n
    return {free: (Fraction(square, q.denominator), Fraction(0))}


def _repeating(m: re.Match) -> Fraction:
    """The rational a repeating decimal such as 0.1\\overline{6} stands for."""
    whole, fixed = m.group(1) or "0", m.group(2)
    if m.group(5) is not None:  # \dot{x}...\dot{y}: the period runs from x to y
        period = m.group(5) + m.group(6) + m.group(7)
    else:
        period = m.group(3) or m.group(4) or m.group(8) or m.group(9)
    scale = 10 ** len(fixed)
    return (
        int(whole)
        + Fraction(int(fixed or "0"), scale)
        + Fraction(int(period), scale * (10 ** len(period) - 1))
    )


class _Tokens:
    """The cursor both exact readers share: tokens as (kind, text) pairs, the next text, one expected token, and
    sums of products; a reader sets `_add(x, y, sign)` to its own kind of value's addition."""

    tokens: list[tuple[str, str]]
    i: int

    def _peek(self, ahead: int = 0) -> str | None:
        return self.tokens[self.i + ahead][1] if self.i + ahead < len(self.tokens) else None

    def _take(self, expected: str) -> None:
        if self._peek() != expected:
            raise ValueError(f"expected {expected}")
        self.i += 1

    def _sum(self):
        value = self._product()
        while self._peek() in ("+", "-"):
            sign = 1 if self.tokens[self.i][1] == "+" else -1
            self.i += 1
            value = self._add(value, self._product(), sign)
        return value


class _Exact(_Tokens):
    """Exact value of arithmetic on rationals, i, square roots of rationals, \\pi and letters: numbers, repeating
    decimals, \\frac, \\sqrt{}, + - * / ^ (whole powers), brackets.  A letter or \\pi takes the value the point
    gives it; `symbols` counts those read."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _REPEATING_RE.match(text, pos)
            if m is not None:
                self.tokens.append(("num", m.group()))
                pos = m.end()
                continue
            m = _EXACT_TOKEN_RE.match(text, pos)
            if m is None:
                raise ValueError("not exact arithmetic")
            self.tokens.append(("num", m.group(1)) if m.group(1) else ("op", m.group(2)))
            pos = m.end()
        self.exact = True
        self.symbols = 0

    def value(self, point: int = 0) -> _Surd:
        self.i, self.point, self.symbols = 0, point, 0
        value = self._sum()
        if self.i != len(self.tokens):
            raise ValueError("trailing tokens")
        return value

    _add = staticmethod(_sadd)

    def _product(self) -> _Surd:
        value = self._unary()
        while True:
            tok = self._peek()
            if tok in ("*", "\\cdot", "\\times", "/", "\\div"):
                self.i += 1
                rhs = self._unary()
                if tok in ("/", "\\div") and self._juxtaposed():
                    raise ValueError("1/2x: math_verify reads 1/(2x), a reader may mean x/2")
                value = _sdiv(value, rhs) if tok in ("/", "\\div") else _smul(value, rhs)
            elif self._juxtaposed():
                if tok == "\\frac" and self.tokens[self.i - 1][0] == "num":
                    raise ValueError("1\\frac{1}{2} may be a mixed number: math_verify decides")
                value = _smul(value, self._power())  # juxtaposition: 4i, 2(3+i), \frac{1}{2}i, 3\sqrt{2}, 2x
            else:
                return value

    def _juxtaposed(self) -> bool:
        """Whether the next token multiplies what came before without a sign: 4i, 2(3+i), 3\\sqrt{2}, 2x."""
        tok = self._peek()
        return tok is not None and (self.tokens[self.i][0] == "num" or tok not in _INFIX)

    def _unary(self) -> _Surd:
        if self._peek() in ("-", "+"):
            sign = -1 if self.tokens[self.i][1] == "-" else 1
            self.i += 1
            return _sadd({}, self._unary(), sign)
        return self._power()

    def _constant(self, read) -> _Surd:
        """What read() returns, refused when it holds a letter or \\pi (a power or a root of one)."""
        before = self.symbols
        value = read()
        if self.symbols != before:
            raise ValueError("a letter in an exponent or under a root is left to sympy")
        return value

    def _power(self) -> _Surd:
        base = self._atom()
        if self._peek() != "^":
            return base
        self.i += 1
        exponent = _rational(self._constant(self._atom if self._peek() != "-" else self._unary))
        if (
            exponent is None
            or exponent[1]
            or exponent[0].denominator != 1
            or abs(exponent[0]) > _MAX_EXACT_POWER
        ):
            raise ValueError("not an exact power")
        result, n = _ONE, abs(int(exponent[0]))
        while n:  # by squaring: x^64 is six products
            if n & 1:
                result = _smul(result, base)
            n >>= 1
            if n:
                base = _smul(base, base)
        return _sdiv(_ONE, result) if exponent[0] < 0 else result

    def _atom(self) -> _Surd:
        if self.i >= len(self.tokens):
            raise ValueError("missing operand")
        kind, tok = self.tokens[self.i]
        self.i += 1
        if kind == "num":
            if tok.isdigit():
                value = Fraction(int(tok))
            elif m := _REPEATING_RE.fullmatch(tok):
                value = _repeating(m)
            else:
                self.exact = False
                value = Fraction(tok)
            return {1: (value, _ZERO)} if value else {}
        if tok == "i":
            return {1: (Fraction(0), Fraction(1))}
        if tok in _POINTS:
            self.symbols += 1
            return {1: (_POINTS[tok][self.point], Fraction(0))}
        if tok in ("(", "{"):
            value = self._sum()
            self._take(")" if tok == "(" else "}")
            return value
        if tok == "\\frac":
            num, den = self._group(), self._group()
            return _sdiv(num, den)
        if tok == "\\sqrt":
            radicand = _rational(self._constant(self._group))
            if radicand is None or radicand[1]:
                raise ValueError("only the square root of a rational is exact here")
            return _sqrt(radicand[0])
        raise ValueError(f"unexpected {tok}")

    def _group(self) -> _Surd:
        self._take("{")
        value = self._sum()
        self._take("}")
        return value


_INFIX = frozenset(("+", "-", "*", "/", "^", ")", "}", "\\cdot", "\\times", "\\div"))


def _small(x: tuple[Fraction, Fraction]) -> tuple[Fraction, Fraction]:
    """x, unless a part has grown past MAX_EXACT_BITS (2^{64^{64}} is not evaluated here)."""
    for part in x:
        if part.numerator.bit_length() > MAX_EXACT_BITS or part.denominator.bit_length() > MAX_EXACT_BITS:
            raise ValueError("too large to evaluate exactly")
    return x


_ZERO = Fraction(0)


def _cmul(x: tuple[Fraction, Fraction], y: tuple[Fraction, Fraction]) -> tuple[Fraction, Fraction]:
    if not x[1] and not y[1]:  # the common case, real numbers: a third of the work
        return _small((x[0] * y[0], _ZERO))
    return _small((x[0] * y[0] - x[1] * y[1], x[0] * y[1] + x[1] * y[0]))


def _cdiv(x: tuple[Fraction, Fraction], y: tuple[Fraction, Fraction]) -> tuple[Fraction, Fraction]:
    if not x[1] and not y[1]:
        if not y[0]:
            raise ValueError("division by zero")
        return _small((x[0] / y[0], _ZERO))
    norm = y[0] * y[0] + y[1] * y[1]
    if not norm:
        raise ValueError("division by zero")
    return _small(((x[0] * y[0] + x[1] * y[1]) / norm, (x[1] * y[0] - x[0] * y[1]) / norm))


_EXACT_ERRORS = (ValueError, ZeroDivisionError, RecursionError, OverflowError)


def _exact(s: str) -> _Value | None:
    """The exact value of a normalised answer that is plain arithmetic on rationals and i, else None."""
    s = s.replace("{,}", "")
    if not s or len(s) > 200 or not any(c.isdigit() for c in s) and "i" not in s:
        return None
    try:
        parser = _Exact(s)
        value = _rational(parser.value())
    except _EXACT_ERRORS:
        return None
    if value is None or parser.symbols:
        return None
    return _Value(value[0], value[1], parser.exact)


class _Key(NamedTuple):
    values: tuple[
        frozenset, frozenset
    ]  # the value at each of the two points (the same twice without unknowns)
    exact: bool  # no finite decimal in it


def _key(s: str) -> _Key | None:
    """The exact value of a normalised answer built from rationals, i, square roots, \\pi and letters, else None."""
    s = s.replace("{,}", "")
    if not s or len(s) > 200:
        return None
    try:
        parser = _Exact(s)
        first = frozenset(parser.value(0).items())
        second = frozenset(parser.value(1).items()) if parser.symbols else first
    except _EXACT_ERRORS:
        return None
    return _Key((first, second), parser.exact)


def _key_verdict(a: str, t: str) -> bool | None:
    """Equal as exact values (2\\sqrt{3} for \\sqrt{12}, (x+1)(x+2) for x^2+3x+2, \\frac{\\pi}{2} for 0.5\\pi):
    True; different with no decimal on either side: False; else None."""
    ak, tk = _key(a), _key(t)
    if ak is None or tk is None:
        return None
    if ak.values == tk.values:
        return True
    return False if ak.exact and tk.exact else None


# ---------------------------------------------------------------- radicals, e, logarithms and trigonometry, exactly
#
# What _Exact leaves (cube roots, fractional powers, e^k, \ln, \sin/\cos/\tan of a number, a root of a letter,
# products of letters, binomial coefficients) is read as a sum of monomials with rational coefficients.  A
# monomial multiplies atoms raised to rational powers: a prime (exponent in (0, 1), the whole part moved into the
# coefficient), e, \pi, a letter, or a function of a constant (\ln 19, \cos 2: whole exponents only).  Every
# rewrite used is an identity for every value of the letters (x^a x^b = x^{a+b}; (c x)^r = c^r x^r only for a
# rational c > 0 and x to the first power), so two answers with the same form are equal: True.  Two forms that
# differ may still be equal (\ln 4 and 2\ln 2), so False needs their values, e as Euler's number and each letter a
# fixed positive number, to differ by more than APART, which no rounding of math_verify's bridges.

MAX_FORM_TERMS = 32
MAX_FORM_BASE = 10**6  # a rational under a fractional power: numerator and denominator factored below this
MAX_FORM_ROOT = 64  # \sqrt[n]{}, and the denominator of a fractional power
MAX_BINOMIAL = 1000
_FORM_FUNCTIONS = frozenset(("\\ln", "\\sin", "\\cos", "\\tan", "\\log"))
_FORM_TOKEN_RE = re.compile(
    r"(\d+\.\d+|\d+|\.\d+)"
    r"|(\\(?:frac|sqrt|binom|dbinom|tbinom|ln|sin|cos|tan|log)(?![a-zA-Z])|\\cdot(?!s)|\\times|\\div(?!ide)"
    r"|\\pi|[-+*/^(){}\[\]_]|[a-df-hj-z](?![({])|e(?![({]))"  # x(x+1): x( may be a function applied
)
_FORM_FLOATS = {"e": math.e, "\\pi": math.pi}
_Mono = tuple  # ((atom, Fraction exponent), ...) sorted by atom
_FormValue = dict  # {monomial: Fraction coefficient}, {} for zero


class _Form(NamedTuple):
    value: frozenset  # the (monomial, coefficient) pairs
    number: float  # its value, e as Euler's number and each letter a fixed positive number
    scale: float  # the sum of its terms' magnitudes (how far float rounding can move `number`)
    exact: bool  # no finite decimal in it
    letters: frozenset


def _prime_factors(n: int) -> dict[int, int]:
    """n's prime factors with their multiplicities, for 1 <= n < MAX_FORM_BASE (so what trial division by the
    primes below 1000 leaves is 1 or a prime)."""
    out: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        if p * p > n:
            break
        while n % p == 0:
            n //= p
            out[p] = out.get(p, 0) + 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def _form_small(q: Fraction) -> Fraction:
    if q.numerator.bit_length() > MAX_EXACT_BITS or q.denominator.bit_length() > MAX_EXACT_BITS:
        raise ValueError("too large to evaluate exactly")
    return q


def _mono_mul(m1: _Mono, m2: _Mono) -> tuple[Fraction, _Mono]:
    """m1 m2 as a rational factor and a monomial: 2^{2/3} 2^{2/3} = 2 * 2^{1/3}."""
    exps = dict(m1)
    for atom, e in m2:
        exps[atom] = exps.get(atom, _ZERO) + e
    factor, out = Fraction(1), []
    for atom, e in exps.items():
        if isinstance(atom, int):  # a prime
            whole = math.floor(e)
            if whole:
                if abs(whole) * atom.bit_length() > MAX_EXACT_BITS:
                    raise ValueError("too large to evaluate exactly")
                factor *= Fraction(atom) ** whole
                e -= whole
        if e:
            out.append((atom, e))
    return factor, tuple(sorted(out, key=lambda item: repr(item[0])))


def _fadd(x: _FormValue, y: _FormValue, sign: int = 1) -> _FormValue:
    out = dict(x)
    for mono, c in y.items():
        total = _form_small(out.get(mono, _ZERO) + sign * c)
        if total:
            out[mono] = total
        else:
            out.pop(mono, None)
    if len(out) > MAX_FORM_TERMS:
        raise ValueError("too many terms")
    return out


def _fmul(x: _FormValue, y: _FormValue) -> _FormValue:
    out: _FormValue = {}
    for m1, c1 in x.items():
        for m2, c2 in y.items():
            factor, mono = _mono_mul(m1, m2)
            out = _fadd(out, {mono: _form_small(c1 * c2 * factor)})
    return out


def _finverse(x: _FormValue) -> _FormValue:
    """1/x for a single term (a sum in a denominator is left to sympy)."""
    if len(x) != 1:
        raise ValueError("not a single term")
    ((mono, c),) = x.items()
    factor, inverse = _mono_mul((), tuple((atom, -e) for atom, e in mono))
    return {inverse: _form_small(factor / c)}


def _fconstant(x: _FormValue) -> Fraction | None:
    if not x:
        return _ZERO
    return x.get(()) if len(x) == 1 else None


def _froot(x: _FormValue, r: Fraction) -> _FormValue:
    """x^r for a fractional r, where an identity gives it: x a single term c M with c > 0 rational and M of
    primes, e, \\pi and at most one letter, that letter to the first power."""
    if len(x) != 1 or r.denominator > MAX_FORM_ROOT or abs(r) > MAX_FORM_ROOT:
        raise ValueError("not a root taken here")
    ((mono, c),) = x.items()
    if c <= 0 or c.numerator >= MAX_FORM_BASE or c.denominator >= MAX_FORM_BASE:
        raise ValueError("not a root taken here")
    letters = [(atom, e) for atom, e in mono if isinstance(atom, str) and atom not in _FORM_FLOATS]
    if letters and (len(letters) > 1 or letters[0][1] != 1 or not letters[0][0].isalpha()):
        raise ValueError("(x^2)^{1/2} is not x: left to sympy")
    powers = [(atom, e * r) for atom, e in mono]
    powers += [(p, k * r) for p, k in _prime_factors(c.numerator).items()]
    powers += [(p, -k * r) for p, k in _prime_factors(c.denominator).items()]
    value: _FormValue = {(): Fraction(1)}
    for atom, e in powers:
        factor, single = _mono_mul((), ((atom, e),))
        value = _fmul(value, {single: factor})
    return value


def _fpower(x: _FormValue, r: Fraction) -> _FormValue:
    if r.denominator != 1:
        return _froot(x, r)
    n = abs(int(r))
    if n > _MAX_EXACT_POWER:
        raise ValueError("not an exact power")
    result: _FormValue = {(): Fraction(1)}
    while n:
        if n & 1:
            result = _fmul(result, x)
        n >>= 1
        if n:
            x = _fmul(x, x)
    return _finverse(result) if r < 0 else result


class _FormParser(_Tokens):
    """Reads a normalised answer into a _FormValue, recording the float value of each function atom; raises
    ValueError on anything outside the grammar (then sympy decides)."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _FORM_TOKEN_RE.match(text, pos)
            if m is None:
                raise ValueError("not in the grammar")
            self.tokens.append(("num", m.group(1)) if m.group(1) else ("op", m.group(2)))
            pos = m.end()
        self.i, self.exact, self.floats, self.letters = 0, True, dict(_FORM_FLOATS), set()

    def parse(self) -> _FormValue:
        value = self._sum()
        if self.i != len(self.tokens):
            raise ValueError("trailing tokens")
        return value

    _add = staticmethod(_fadd)

    def _juxtaposed(self) -> bool:
        tok = self._peek()
        return tok is not None and (
            self.tokens[self.i][0] == "num" or tok not in _INFIX and tok not in ("]", "_")
        )

    def _product(self) -> _FormValue:
        value = self._unary()
        while True:
            tok = self._peek()
            if tok in ("*", "\\cdot", "\\times", "/", "\\div"):
                self.i += 1
                rhs = self._unary()
                if tok in ("/", "\\div"):
                    if self._juxtaposed():
                        raise ValueError("1/2x: math_verify reads 1/(2x), a reader may mean x/2")
                    rhs = _finverse(rhs)
                value = _fmul(value, rhs)
            elif self._juxtaposed():
                if tok == "\\frac" and self.tokens[self.i - 1][0] == "num":
                    raise ValueError("1\\frac{1}{2} may be a mixed number: math_verify decides")
                value = _fmul(value, self._power())
            else:
                return value

    def _unary(self) -> _FormValue:
        if self._peek() in ("-", "+"):
            sign = -1 if self.tokens[self.i][1] == "-" else 1
            self.i += 1
            return _fadd({}, self._unary(), sign)
        return self._power()

    def _rational(self, read) -> Fraction:
        value = _fconstant(read())
        if value is None:
            raise ValueError("not a rational here")
        return value

    def _power(self) -> _FormValue:
        start = self.i
        base = self._atom()
        if self._peek() != "^":
            return base
        if self.tokens[start][1] in _FORM_FUNCTIONS:
            raise ValueError("\\sin{1}^2: left to sympy")
        self.i += 1
        return _fpower(base, self._rational(self._atom if self._peek() != "-" else self._unary))

    def _group(self) -> _FormValue:
        self._take("{")
        value = self._sum()
        self._take("}")
        return value

    def _atom(self) -> _FormValue:
        if self.i >= len(self.tokens):
            raise ValueError("missing operand")
        kind, tok = self.tokens[self.i]
        self.i += 1
        if kind == "num":
            if not tok.isdigit():
                self.exact = False
            value = Fraction(tok)
            return {(): value} if value else {}
        if tok in ("(", "{"):
            value = self._sum()
            self._take(")" if tok == "(" else "}")
            return value
        if tok in ("e", "\\pi"):
            return {((tok, Fraction(1)),): Fraction(1)}
        if len(tok) == 1 and tok.isalpha():
            if self._peek() is not None and self.tokens[self.i][0] == "op" and self._peek().isalpha():
                previous = self.tokens[self.i - 2] if self.i >= 2 else ("op", "")
                if previous[0] != "num" and previous[1] not in ("\\cdot", "\\times"):
                    raise ValueError("a run of letters with no coefficient may be a word")
            self.letters.add(tok)
            self.floats[tok] = 0.5 + math.sqrt(ord(tok)) / 3  # x is 4.15...: no MATH answer is built on it
            return {((tok, Fraction(1)),): Fraction(1)}
        if tok == "\\frac":
            return _fmul(self._group(), _finverse(self._group()))
        if tok == "\\sqrt":
            index = Fraction(2)
            if self._peek() == "[":
                self.i += 1
                index = self._rational(self._sum)
                self._take("]")
                if index.denominator != 1 or not 2 <= index <= MAX_FORM_ROOT:
                    raise ValueError("not a root index")
            return _froot(self._group(), 1 / index)
        if tok in ("\\binom", "\\dbinom", "\\tbinom"):
            n, k = self._rational(self._group), self._rational(self._group)
            if n.denominator != 1 or k.denominator != 1 or not 0 <= k <= n <= MAX_BINOMIAL:
                raise ValueError("not a binomial coefficient of small whole numbers")
            return {(): Fraction(math.comb(int(n), int(k)))}
        if tok in _FORM_FUNCTIONS:
            return self._function(tok)
        raise ValueError(f"unexpected {tok}")

    def _function(self, name: str) -> _FormValue:
        base = None
        # \log_{10} 15; a bare \log is read differently by different people: sympy decides
        if name == "\\log":
            self._take("_")
            base = self._argument()
        argument = self._argument()
        # what may follow: math_verify reads \cos 2x, \sin{1}^2 and \ln 7\cdot 10 as \cos(2x), \sin(1^2), \ln 70
        if self._peek() not in (None, "+", "-", ")", "}"):
            raise ValueError("where the argument ends is left to sympy")
        if base is None:
            return self._apply(name, argument)
        return _fmul(self._apply("\\ln", argument), _finverse(self._apply("\\ln", base)))

    def _argument(self) -> _FormValue:
        tok = self._peek()
        if tok in ("{", "("):
            value = self._atom()
        elif tok == "\\frac" or self.i < len(self.tokens) and self.tokens[self.i][0] == "num":
            value = self._atom()
        else:
            raise ValueError("a function's argument is left to sympy")
        if any(isinstance(atom, str) and atom not in _FORM_FLOATS for mono in value for atom, _ in mono):
            raise ValueError("a letter in a function's argument is left to sympy")
        return value

    def _apply(self, name: str, argument: _FormValue) -> _FormValue:
        x = _form_float(argument, self.floats)
        y = {"\\ln": math.log, "\\sin": math.sin, "\\cos": math.cos, "\\tan": math.tan}[name](x)
        if name == "\\ln" and not x > 0 or not math.isfinite(y) or y == 0:
            raise ValueError("outside the function's domain, or a value of 0: sympy decides")
        atom = f"{name}({sorted(map(repr, argument.items()))!r})"
        self.floats[atom] = y
        return {((atom, Fraction(1)),): Fraction(1)}


def _form_float(value: _FormValue, floats: dict, scale: bool = False) -> float:
    """value as a float (or the sum of its terms' magnitudes); OverflowError/ValueError when out of range."""
    total = 0.0
    for mono, c in value.items():
        term = float(c)
        for atom, e in mono:
            term *= math.pow(floats[atom] if isinstance(atom, str) else atom, float(e))
        total += abs(term) if scale else term
    if not math.isfinite(total):
        raise OverflowError("too large")
    return total


@functools.lru_cache(maxsize=4096)
def _form(s: str) -> _Form | None:
    if not s or len(s) > 200:
        return None
    try:
        parser = _FormParser(s)
        value = parser.parse()
        number = _form_float(value, parser.floats)
        scale = _form_float(value, parser.floats, scale=True)
    except (*_EXACT_ERRORS, KeyError, TypeError):
        return None
    return _Form(frozenset(value.items()), number, scale, parser.exact, frozenset(parser.letters))


def _form_verdict(a: str, t: str) -> bool | None:
    """The same form: True; values that differ by more than rounding, with the same letters and no decimals:
    False; else None."""
    fa, ft = _form(a), _form(t)
    if fa is None or ft is None:
        return None
    for f in (fa, ft):  # a lone letter is something else to math_verify (a choice, a name): it decides
        if any(f.value == {(((x, Fraction(1)),), Fraction(1))} for x in f.letters):
            return None
    if fa.value == ft.value:
        return True
    if not (fa.exact and ft.exact) or fa.letters != ft.letters:
        return None
    gap = abs(fa.number - ft.number)
    if gap > APART * max(1.0, abs(fa.number), abs(ft.number)) and gap > 1e-9 * (fa.scale + ft.scale):
        return False
    return None


_UNIT_SPELLINGS = {  # the words for one unit that models write
    "cm": "centimeter",
    "m": "meter",
    "km": "kilometer",
    "mm": "millimeter",
    "in": "inch",
    "inche": "inch",
    "ft": "foot",
    "feet": "foot",
    "sec": "second",
    "s": "second",
    "min": "minute",
    "h": "hour",
    "hr": "hour",
    "g": "gram",
    "kg": "kilogram",
    "mph": "milesperhour",
    "sq": "square",
}


def _unit_name(unit: str) -> str:
    """One name for a unit word as _norm leaves it: \\text{cm}^2, \\text{centimeters}^2 -> centimeter2."""
    m = re.fullmatch(r"\\(?:text|mbox|mathrm)\{([a-zA-Z.]+)\}(?:\^\{?([23])\}?)?", unit)
    word = m.group(1).lower().rstrip(".") if m else unit
    for prefix in ("square", "sq", "cubic"):
        if word.startswith(prefix) and len(word) > len(prefix):
            word, power = word[len(prefix) :], "2" if prefix != "cubic" else "3"
            break
    else:
        power = m.group(2) or "" if m else ""
    word = word[:-1] if word.endswith("s") and len(word) > 3 else word
    return _UNIT_SPELLINGS.get(word, word) + power


_ONE_LETTER_UNITS = frozenset("mgsh")  # \text{ m} is metres; \mathrm{i} or \text{e} is no unit


def _measures(a: str, t: str) -> bool:
    """Each unit word that ends a or t names a unit (cm, inches, miles), not a letter that may be a number."""
    for side in (a, t):
        unit = _UNIT_WORD_RE.search(side)
        if unit is not None:
            word = re.sub(r"\\[a-z]+\{|[}^{23.]", "", unit.group()).lower()
            if len(word) < 2 and word not in _ONE_LETTER_UNITS:
                return False
    return True


_DEGREES_RE = re.compile(r"\^\\circ$")
_PERCENT_RE = re.compile(r"\\?%$")
_BASE_RE = re.compile(r"(?:\\text\{(\w+)\}|\((\w+)\)|([0-9A-Za-z]+))_(?:\{(\d{1,2})\}|(\d))")
_DIGITS_RE = re.compile(r"[0-9A-Za-z]+")
_UNIT_WORD_RE = re.compile(r"\\(?:text|mbox|mathrm)\{[a-zA-Z.]+\}(?:\^\{?[23]\}?)?$")  # 5\text{ cm}^2


def _based(s: str) -> tuple[str, int] | None:
    """(digits, base) for a numeral with a subscript base such as 1011_2 or \\text{A3}_{16}."""
    m = _BASE_RE.fullmatch(s)
    if m is None:
        return None
    digits = m.group(1) or m.group(2) or m.group(3)
    base = int(m.group(4) or m.group(5))
    if not 2 <= base <= 36 or not _numeral(digits, base):
        return None  # P_2 is a point, x_2 a variable, not numerals
    return digits, base


def _numeral(digits: str, base: int) -> bool:
    """Whether digits can be a numeral in base: valid digits, and lower case only beside a digit (a3, not a)."""
    if _in_base(digits, base) is None:
        return False
    return digits.upper() == digits or len(digits) > 1 and any(c.isdigit() for c in digits)


def _in_base(digits: str, base: int) -> int | None:
    try:
        return int(digits, base)
    except ValueError:
        return None


def _base_verdict(answer: str, truth: str) -> bool | None:
    """A subscript base is part of the value: right only in the truth's base, with the truth's value."""
    t, a = _based(truth), _based(answer)
    if t is None and a is None:
        return None
    if t is None:  # the truth is in base 10: the answer must be too
        value = _exact(truth)
        return a[1] == 10 and value is not None and not value.im and value.re == _in_base(a[0], 10)
    want = _in_base(*t)
    if a is not None:
        return a[1] == t[1] and want is not None and _in_base(*a) == want
    if _DIGITS_RE.fullmatch(answer) is None or not answer.isdigit() and not _numeral(answer, t[1]):
        return None
    return want is not None and _in_base(answer, t[1]) == want


_RELATION_RE = re.compile(r"(\\(?:leqslant|geqslant|leq|geq|le|ge|lt|gt)|<=|>=|≤|≥|<|>)")  # 3\geq x: "3\geqx"
_LESS = {"<": "<", "\\lt": "<", "\\le": "\\le", "\\leq": "\\le", "<=": "\\le", "≤": "\\le"}
_LESS["\\leqslant"] = "\\le"
_GREATER = {">": "<", "\\gt": "<", "\\ge": "\\le", "\\geq": "\\le", ">=": "\\le", "≥": "\\le"}
_GREATER["\\geqslant"] = "\\le"


_SET_BUILDER_RE = re.compile(r"\\\{(?:[a-zA-Z]|\\[a-z]+)(?:\\mid|\||:)(.+)\\\}")


class _Chain(NamedTuple):
    terms: list[str]
    relations: list[str]  # "<" or "\\le", read left to right
    turned: bool  # written with > / >= and turned round


def _chain(s: str) -> _Chain | None:
    """An inequality chain read with < and <= only (3>x>-2 is -2<x<3), None when s is not one."""
    if "arrow" in s:  # \leftarrow, \Longleftrightarrow: not a relation of order
        return None
    builder = _SET_BUILDER_RE.fullmatch(s)  # \{x\mid -2<x<3\} is the inequality it holds to
    if builder is not None:
        s = builder.group(1)
    parts = _RELATION_RE.split(s)
    if len(parts) < 3 or any(not p for p in parts[::2]):
        return None
    terms, relations = parts[::2], parts[1::2]
    if all(r in _LESS for r in relations):
        return _Chain(terms, [_LESS[r] for r in relations], False)
    if all(r in _GREATER for r in relations):
        return _Chain(terms[::-1], [_GREATER[r] for r in relations[::-1]], True)
    return None


def _chain_text(chain: _Chain) -> str:
    return chain.terms[0] + "".join(r + t for r, t in zip(chain.relations, chain.terms[1:], strict=True))


def _term_verdict(a: str, t: str) -> bool | None:
    if a == t:
        return True
    av, tv = _exact(a), _exact(t)
    if av is None or tv is None:
        return _key_verdict(a, t)
    return (av.re, av.im) == (tv.re, tv.im) or (None if not (av.exact and tv.exact) else False)


def _chain_verdict(answer: str, truth: str) -> bool | None:
    """Inequalities compared term by term in one direction (3>x>-2 is -2<x<3), or as intervals."""
    a, t = _chain(answer), _chain(truth)
    if a is None and t is None:
        return None
    if a is None or t is None or len(a.terms) != len(t.terms):
        return _interval_verdict(answer, truth)  # -2<x<3 against (-2,3) or x\in(-2,3)
    if a.relations != t.relations:
        return False
    verdict = _all_verdict([_term_verdict(x, y) for x, y in zip(a.terms, t.terms, strict=True)])
    return _interval_verdict(answer, truth) if verdict is None else verdict  # x>1 against x<1


def _all_verdict(verdicts: list[bool | None]) -> bool | None:
    if False in verdicts:
        return False
    return True if all(verdicts) else None


_VARIABLE_RE = re.compile(r"[a-zA-Z]|\\[a-z]+")
_INTERVAL_RE = re.compile(r"(?:(?:[a-zA-Z]|\\[a-z]+)\\in)?([(\[])([^,()\[\]]+),([^,()\[\]]+)([)\]])")
_INFINITY = {"\\infty": 1, "+\\infty": 1, "-\\infty": -1}


class _Interval(NamedTuple):
    low: str
    low_closed: bool
    high: str
    high_closed: bool
    variable: str | None  # the letter of an inequality; None for interval notation


def _interval(s: str) -> _Interval | None:
    """The interval an inequality in one variable or an interval (a,b], x\\in[a,b) stands for."""
    chain = _chain(s)
    if chain is not None:
        terms, closed = chain.terms, [r == "\\le" for r in chain.relations]
        if len(terms) == 3 and _VARIABLE_RE.fullmatch(terms[1]):
            return _Interval(terms[0], closed[0], terms[2], closed[1], terms[1])
        if len(terms) == 2 and _VARIABLE_RE.fullmatch(terms[0]):
            return _Interval("-\\infty", False, terms[1], closed[0], terms[0])
        if len(terms) == 2 and _VARIABLE_RE.fullmatch(terms[1]):
            return _Interval(terms[0], closed[0], "\\infty", False, terms[1])
        return None
    m = _INTERVAL_RE.fullmatch(s)
    if m is None:
        return None
    return _Interval(m.group(2), m.group(1) == "[", m.group(3), m.group(4) == "]", None)


def _endpoint_verdict(a: str, t: str) -> bool | None:
    if a in _INFINITY or t in _INFINITY:
        return _INFINITY.get(a) == _INFINITY.get(t)
    return _term_verdict(a, t)


def _interval_verdict(answer: str, truth: str) -> bool | None:
    a, t = _interval(answer), _interval(truth)
    if a is None or t is None or a.variable is None and t.variable is None:
        return None  # (1,2) against (1,2] is left as it was: it may be a point
    if a.variable and t.variable and a.variable != t.variable:
        return None
    closed = (a.low_closed, a.high_closed) == (t.low_closed, t.high_closed)
    ends = _all_verdict([_endpoint_verdict(a.low, t.low), _endpoint_verdict(a.high, t.high)])
    return ends if ends is not True or closed else False


def _numeric_verdict(a: _Value, t: _Value) -> bool | None:
    if (a.re, a.im) == (t.re, t.im):
        return True
    # math_verify compares decimals after rounding; only a clear gap is decided here
    gap = max(abs(a.re - t.re), abs(a.im - t.im))
    if not (a.exact and t.exact) and gap <= Fraction(1, 10_000) * max(1, abs(t.re), abs(t.im)):
        return None
    return False


_ASSIGNMENT_RE = re.compile(r"([a-zA-Z])=([^=<>]+)")  # x=5: the value of one variable
_NAMED_VALUE_RE = re.compile(r"([a-zA-Z]|\\[a-zA-Z]+)=([^=<>]+)")  # x=5, \theta=2


def _assignments(s: str) -> list[tuple[str, str]] | None:
    """A tuple written out as the values of different unknowns, x=2,y=3 (normalised), as [(x, 2), (y, 3)]; None
    for anything else (x=1,x=2 is a list of solutions, x=1,000 is one number)."""
    if s.count("=") < 2 or _THOUSANDS_GROUP_RE.search(s):
        return None
    pairs = []
    for part in _top_level(_ALTERNATIVES_AND_RE.sub(",", s), comma_needs_space=False) or ():
        named = _NAMED_VALUE_RE.fullmatch(part)
        if named is None:
            return None
        pairs.append((named.group(1), named.group(2)))
    names = [name for name, _ in pairs]
    return pairs if len(pairs) > 1 and len(set(names)) == len(names) else None


def _assignments_verdict(a: str, t: str) -> bool | None:
    """x=2, y=3 is the tuple (2,3): right for the same values of the same unknowns (in any order) or for the
    point (2,3) (in the order written); never for one value nor for a set of solutions."""
    a_pairs, t_pairs = _assignments(a), _assignments(t)
    if a_pairs is not None and t_pairs is not None:
        a_map, t_map = dict(a_pairs), dict(t_pairs)
        if a_map.keys() != t_map.keys():
            return False
        return _all_verdict([_verdict_one(value, t_map[name]) for name, value in a_map.items()])
    pairs, other = (a_pairs, t) if a_pairs is not None else (t_pairs, a)
    if pairs is None:
        return None
    if _collection(other) != "pair":
        return False  # two unknowns' values for one value or a set: which one is meant is not said
    written = "(" + ",".join(value for _, value in pairs) + ")"
    return _verdict_one(written, t) if a_pairs is not None else _verdict_one(a, written)


_WRAPPED_WORD_RE = re.compile(r"\\(?:text|textbf|textit|textrm|mbox|mathrm)\{([a-zA-Z'-]+)\}")  # spaces gone
_PLAIN_WORD_RE = re.compile(r"[a-zA-Z'-]+")


def _spelled(s: str) -> str | None:
    """A number written in words (after _norm: twentyfour, \\text{twelve}) as digits, else None."""
    wrapped = _WRAPPED_WORD_RE.fullmatch(s) if s.startswith("\\") else None
    word = wrapped.group(1) if wrapped else s
    if not _PLAIN_WORD_RE.fullmatch(word):
        return None
    word = word.lower().replace("-", "")
    tokens = _NUMBER_TOKEN_RE.findall(word)
    value = _spelled_value(tokens) if "".join(tokens) == word else None
    return None if value is None else str(value)


def _word(s: str) -> tuple[str, bool] | None:
    """(the word or words, lower case, a plural's s dropped; whether written in \\text{}), None if not words."""
    wrapped = _WRAPPED_WORD_RE.fullmatch(s) if s.startswith("\\") else None
    word = wrapped.group(1) if wrapped else s
    if not _PLAIN_WORD_RE.fullmatch(word):
        return None
    word = word.lower().replace("-", "").replace("'", "")
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):  # no solutions
        word = word[:-1]
    return word, wrapped is not None


def _word_verdict(a: str, t: str) -> bool | None:
    """Words against words, whatever their case (Monday for \\text{Monday}); a word is not a number."""
    wa, wt = _word(a), _word(t)
    if wa is None and wt is None:
        return None
    if wa is not None and wt is not None:
        # plain letters on both sides may be algebra (ab for ba): math_verify decides those
        return wa[0] == wt[0] if wa[1] or wt[1] else None
    word, other = (wa, t) if wa is not None else (wt, a)
    return False if word[1] and _exact(other) is not None else None


_ALTERNATIVES_RE = re.compile(r"\\text\{(?:or|and)\}")  # 1 \text{ or } 2 after _norm
_ALTERNATIVES_AND_RE = re.compile(r"\\text\{and\}")  # x=2 \text{ and } y=3 after _norm: a tuple
_PLUS_MINUS_RE = re.compile(r"\\(?:pm|mp)")
_THOUSANDS_GROUP_RE = re.compile(r"\d,\d{3}(?!\d)")


def _values(s: str) -> set[tuple[frozenset, ...]] | None:
    """The exact values a list of solutions holds (1,2 / x=1,x=2 / \\pm5 / 3\\pm1), None if one is not exact."""
    items = _top_level(_ALTERNATIVES_RE.sub(",", s), comma_needs_space=False)
    if items is None:
        return None
    values = set()
    for item in items:
        assigned = _ASSIGNMENT_RE.fullmatch(item)
        item = assigned.group(2) if assigned else item
        sign = _PLUS_MINUS_RE.search(item)
        if sign is not None:  # 3\pm1 is 3+(1) and 3-(1)
            head, tail = item[: sign.start()], item[sign.end() :]
            spellings = [f"{head}+({tail})", f"{head}-({tail})"]
        for text in spellings if sign is not None else [item]:
            key = _key(text)
            if key is None or not key.exact:  # decimals keep math_verify's rounding
                return None
            values.add(key.values)
    return values


def _tuple_verdict(a: str, t: str) -> bool | None:
    """Points and intervals written with the same brackets, element by element: (51,-99) is not (-99,51)."""
    if len(a) < 5 or len(t) < 5 or (a[0], a[-1]) != (t[0], t[-1]) or a[0] not in "([" or a[-1] not in ")]":
        return None
    items_a, items_t = (
        _top_level(a[1:-1], comma_needs_space=False),
        _top_level(t[1:-1], comma_needs_space=False),
    )
    if items_a is None or items_t is None or len(items_a) != len(items_t) or len(items_a) < 2:
        return None
    if _THOUSANDS_GROUP_RE.search(a) or _THOUSANDS_GROUP_RE.search(t):
        return None  # (1,000, 2): separators or items, math_verify decides
    return _all_verdict([_verdict_one(x, y) for x, y in zip(items_a, items_t, strict=True)])


def _unbraced(s: str) -> str:
    """The elements of a flat set written \\{1,2\\}: 1,2 (a list of solutions is a set already); s otherwise."""
    if s.startswith("\\{") and s.endswith("\\}") and "\\{" not in s[2:-2] and "\\}" not in s[2:-2]:
        return s[2:-2]
    return s


def _set_verdict(a: str, t: str) -> bool | None:
    """Solutions as sets of exact values: 1 or 2 for 1, 2; 5, -5 for \\pm 5; \\{2,1\\} for \\{1,2\\}; not 5 alone,
    nor the pair (1, 2)."""
    a, t = _unbraced(a), _unbraced(t)
    alternatives = _ALTERNATIVES_RE.search(a) is not None
    bracketed = t[:1] in ("(", "[") and t[-1:] in (")", "]") and "," in t
    if alternatives and bracketed and len(_top_level(t, comma_needs_space=False) or ()) == 1:
        return False  # "1 or 2" is two answers, not the point or interval (1, 2)
    if not (alternatives or "," in a or "," in t or "\\pm" in a or "\\pm" in t or "\\mp" in a or "\\mp" in t):
        return None
    if _THOUSANDS_GROUP_RE.search(a) or _THOUSANDS_GROUP_RE.search(t):
        return None  # 1,000, 2,000: separators or items, math_verify decides
    av, tv = _values(a), _values(t)
    if av is None or tv is None or len(av) == 1 and len(tv) == 1:
        return None
    return av == tv


def _collection(s: str) -> str | None:
    """'pair' for one bracketed tuple or interval of several items ((3,-3), [1,2)), 'set' for several solutions
    (3,-3 / 3 \\text{or} -3 / \\pm3 / \\{3,-3\\} / (1,2),(3,4)), None for one value.  One rule, both directions:
    a pair is never a set, so neither is right for the other."""
    if _THOUSANDS_GROUP_RE.search(s):
        return None  # 1,000: a separator or a list, math_verify decides
    parts = _top_level(s, comma_needs_space=False)
    if parts is None or _SET_BUILDER_RE.fullmatch(s):  # \\{x \\mid -2<x<3\\} is an interval
        return None
    if len(parts) > 1 or s.startswith("\\{") and s.endswith("\\}") or _ALTERNATIVES_RE.search(s):
        return "set"
    if s[:1] in "([" and s[-1:] in ")]" and len(_top_level(s[1:-1], comma_needs_space=False) or ()) > 1:
        return "pair"
    return "set" if _PLUS_MINUS_RE.search(s) else None


# ---------------------------------------------------------------- more shapes decided exactly (issue 47)
#
# Shapes that used to reach sympy, mostly as near misses: multiple-choice letters, matrices and vectors entry by
# entry, intervals whose brackets differ at a finite end, unions of intervals (as sets of reals), and logarithms
# of one base.  Each decides only where the decision is exact; anything else is left to math_verify as before.

_CHOICE_TRUTH_RE = re.compile(r"\\text\{\(([A-E])\)\}|\(([A-E])\)")
_CHOICE_ANSWER_RE = re.compile(r"\\text\{\(([A-E])\)\}|\(([A-E])\)|\\text\{([A-E])\}|([A-E])")
_MATRIX_RE = re.compile(r"\\begin\{pmatrix\}(.*)\\end\{pmatrix\}", re.DOTALL)
_LOG_RE = re.compile(r"\\log_(?:\{([^{}]+)\}|(\d))(?:\{([^{}]+)\}|\(([^()]+)\)|(\d+))")
_ROW_END_RE = re.compile(r"\\\\?(?![a-zA-Z{}])")
MAX_MATRIX_CELLS = 64


def _choice_verdict(a: str, t: str) -> bool | None:
    """\\text{(C)}, (C), C for the truth \\text{(C)} or (C): the letter decides."""
    truth = _CHOICE_TRUTH_RE.fullmatch(t)
    answer = _CHOICE_ANSWER_RE.fullmatch(a) if truth is not None else None
    if answer is None:
        return None
    return next(g for g in answer.groups() if g) == next(g for g in truth.groups() if g)


def _cells(s: str) -> list[list[str]] | None:
    m = _MATRIX_RE.fullmatch(s)
    if m is None or "\\begin" in m.group(1):
        return None
    # rows end at \\\\ (which _norm may have left as one backslash: "\\\\ -18" loses "\\ " as a space)
    rows = [row.split("&") for row in _ROW_END_RE.split(m.group(1)) if row]
    return rows if rows and sum(map(len, rows)) <= MAX_MATRIX_CELLS else None


def _matrix_verdict(a: str, t: str) -> bool | None:
    """Matrices and vectors (pmatrix, bmatrix, ...): the same shape and every entry equal."""
    ta = _cells(t)
    if ta is None:
        return None
    aa = _cells(a)
    if aa is None:
        return None
    if [len(r) for r in aa] != [len(r) for r in ta]:
        return False
    return _all_verdict(
        [_verdict_one(x, y) for ra, rt in zip(aa, ta, strict=True) for x, y in zip(ra, rt, strict=True)]
    )


def _real(s: str) -> Fraction | float | None:
    """An endpoint as an exact rational (or +-inf), None when it is not one."""
    if s in _INFINITY:
        return _INFINITY[s] * math.inf
    value = _exact(s)
    return value.re if value is not None and value.im == 0 else None


def _reals(s: str) -> list[tuple] | None:
    """A union of intervals as sorted disjoint (low, low_closed, high, high_closed), None if not exactly one."""
    pieces = s.split("\\cup")
    if len(pieces) > 16:
        return None
    spans = []
    for piece in pieces:
        m = _INTERVAL_RE.fullmatch(piece)
        if m is None or piece.startswith(("x", "\\")):
            return None
        low, high = _real(m.group(2)), _real(m.group(3))
        if low is None or high is None:
            return None
        low_closed, high_closed = (
            m.group(1) == "[" and low != -math.inf,
            m.group(4) == "]" and high != math.inf,
        )
        if low < high or low == high and low_closed and high_closed:
            spans.append((low, not low_closed, high, high_closed))  # sorts a closed start first
    merged: list[list] = []
    for low, low_open, high, high_closed in sorted(spans):
        if merged and (low < merged[-1][2] or low == merged[-1][2] and (merged[-1][3] or not low_open)):
            last = merged[-1]
            if high > last[2] or high == last[2] and high_closed:
                last[2], last[3] = high, high_closed
        else:
            merged.append([low, low_open, high, high_closed])
    return [tuple(m) for m in merged]


def _union_verdict(a: str, t: str) -> bool | None:
    """Intervals and unions of intervals as sets of reals: (1,3] \\cup (3,5) is (1,5); [1,2] is not [1,2)."""
    if "\\cup" not in a + t and (a[:1] + a[-1:] == t[:1] + t[-1:] or "[" not in a + t and "]" not in a + t):
        return None  # one interval with the same brackets (or a point): the rules above decide it
    if not (a[:1] in "([" and t[:1] in "([" and a[-1:] in ")]" and t[-1:] in ")]"):
        return None
    ra, rt = _reals(a), _reals(t)
    if ra is None or rt is None:
        return None
    return ra == rt


def _log_verdict(a: str, t: str) -> bool | None:
    """\\log_2 17 against \\log_{2} 16: one base, so the arguments decide."""
    ma, mt = _LOG_RE.fullmatch(a), _LOG_RE.fullmatch(t)
    if ma is None or mt is None:
        return None
    base_a, base_t = _real(ma.group(1) or ma.group(2)), _real(mt.group(1) or mt.group(2))
    arg_a = _real(next(g for g in ma.groups()[2:] if g))
    arg_t = _real(next(g for g in mt.groups()[2:] if g))
    if (
        None in (base_a, base_t, arg_a, arg_t)
        or min(base_a, base_t, arg_a, arg_t) <= 0
        or 1 in (base_a, base_t)
    ):
        return None
    if base_a == base_t:
        return arg_a == arg_t
    # \log_3 34 against \log_2 34: told apart when their values differ by far more than rounding can make
    # (math_verify spends most of a second on it in sympy); values this close are left to sympy
    try:
        value_a, value_t = _ln(arg_a) / _ln(base_a), _ln(arg_t) / _ln(base_t)
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
    return False if abs(value_a - value_t) > LOG_APART * max(1.0, abs(value_t)) else None


LOG_APART = 1e-9  # relative gap between two logarithms' float values that rounding cannot make


def _ln(x: Fraction | float) -> float:
    """The natural logarithm of a positive rational, however large its numerator and denominator."""
    if isinstance(x, Fraction):
        return math.log(x.numerator) - math.log(x.denominator)
    return math.log(x)


def _verdict_one(a: str, t: str) -> bool | None:
    """True/False when the answer and one truth are decided without sympy, None when sympy must."""
    if a == t:
        return True
    a, t = _spelled(a) or a, _spelled(t) or t  # twelve is 12
    if a == t:
        return True
    if "=" in a or "=" in t:
        verdict = _assignments_verdict(a, t)  # x=2, y=3: a tuple written out (None: neither is one, or sympy)
        if verdict is not None or _assignments(a) is not None or _assignments(t) is not None:
            return verdict
    a_set, t_set = _ASSIGNMENT_RE.fullmatch(a), _ASSIGNMENT_RE.fullmatch(t)
    if a_set is not None and (t_set is None and "=" not in t or t_set and t_set.group(1) == a_set.group(1)):
        return _verdict_one(a_set.group(2), t_set.group(2) if t_set else t)  # x=5 for 5, or for x=5
    if t_set is not None and a_set is None and "=" not in a:
        return _verdict_one(a, t_set.group(2))
    kinds = {_collection(a), _collection(t)}
    if kinds == {"pair", "set"}:  # (3,-3) for \\pm3, 3 or -3 for (3,-3): a set is not a pair, either way
        return False
    for rule in (_word_verdict, _set_verdict):
        verdict = rule(a, t)
        if verdict is not None:
            return verdict
    a_unit, t_unit = _UNIT_WORD_RE.search(a), _UNIT_WORD_RE.search(t)
    if a_unit and t_unit and _unit_name(a_unit.group()) != _unit_name(t_unit.group()):
        return False  # 5 m is not 5 cm (math_verify 0.9.0 drops both units and would say it is)
    for rule in (_choice_verdict, _matrix_verdict, _log_verdict, _union_verdict):
        verdict = rule(a, t)
        if verdict is not None:
            return verdict
    for rule in (_base_verdict, _chain_verdict, _tuple_verdict):
        verdict = rule(a, t)
        if verdict is not None:
            return verdict
    # MATH's convention: a number is right when the truth merely appends a unit, degree or percent sign
    aw, tw = _UNIT_WORD_RE.sub("", a), _UNIT_WORD_RE.sub("", t)
    au, tu = _DEGREES_RE.sub("", aw), _DEGREES_RE.sub("", tw)
    ap, tp = _PERCENT_RE.sub("", au), _PERCENT_RE.sub("", tu)
    av, tv = _exact(ap), _exact(tp)
    if av is None or tv is None:
        # square roots, \pi, letters: only as written (60^\circ is \frac{\pi}{3} to math_verify)
        if (a, t) != (ap, tp):
            return None
        verdict = _key_verdict(a, t)
        return verdict if verdict is not None else _form_verdict(a, t)
    verdict = _numeric_verdict(av, tv)
    if (aw != a or tw != t) and (ap, tp) == (aw, tw) and _measures(a, t):
        # 6\text{ cm} for 5, 500 for 5\text{ m}: the numbers decide, as they do for math_verify
        return verdict
    both_percent = ap != au and tp != tu and (a, t) == (aw, tw) and (au, tu) == (aw, tw)
    if (ap != au or tp != tu or aw != a or tw != t) and verdict is not True and not both_percent:
        return None  # (35\% against 34\%: the same sign both sides, the numbers decide)  # 0.5 may be meant for 50\%, 500 for 5 m in cm: what math_verify makes of it stands
    return verdict


def fast_verdict(answer: str, truths: tuple[str, ...], normed: tuple[str, ...] | None = None) -> bool | None:
    """True/False when spelling or exact arithmetic decides, None when sympy must; normed: the truths already
    through _norm (a _Gold's, shared by the answers to one prompt)."""
    a = _norm(answer)
    if not a:
        return None
    verdicts = [_verdict_one(a, t) for t in (normed if normed is not None else map(_norm, truths))]
    if True in verdicts:
        return True
    return False if verdicts and all(v is False for v in verdicts) else None


def _for_sympy(s: str) -> str:
    """A spelling math_verify reads as meant: degree signs, repeating decimals as fractions, chains with <."""
    s = _unicode(s)

    def fraction(m: re.Match) -> str:
        value = _repeating(m)
        return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"

    s = _REPEATING_RE.sub(fraction, s)
    chain = _chain(_norm(s))
    return _chain_text(chain) if chain is not None and chain.turned else s


class _Numeric:
    """Magnitude of a purely numeric expression (digits, + - * / ^ and brackets), inf when huge."""

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            m = _NUM_TOKEN_RE.match(text, pos)
            if m is None:
                raise ValueError("not numeric")
            self.tokens.append(m.group(1))
            pos = m.end()
        self.i = 0
        self.max_exponent = 0.0

    def value(self) -> float:
        v = self._sum()
        if self.i != len(self.tokens):
            raise ValueError("trailing tokens")
        return v

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _sum(self) -> float:
        v = self._product()
        while self._peek() in ("+", "-"):
            op = self.tokens[self.i]
            self.i += 1
            rhs = self._product()
            v = v + rhs if op == "+" else v - rhs
        return v

    def _product(self) -> float:
        v = self._power()
        while self._peek() in ("*", "/", "\\cdot", "\\times"):
            op = self.tokens[self.i]
            self.i += 1
            rhs = self._power()
            v = (v / rhs if rhs else math.inf) if op == "/" else v * rhs
        return v

    def _power(self) -> float:
        base = self._atom()
        if self._peek() != "^":
            return base
        self.i += 1
        exponent = self._power()
        if abs(base) > 1:
            self.max_exponent = max(self.max_exponent, exponent)
        try:
            return math.pow(abs(base), exponent)
        except OverflowError:
            return math.inf

    def _atom(self) -> float:
        tok = self._peek()
        if tok is None:
            raise ValueError("missing operand")
        self.i += 1
        if tok in ("(", "{"):
            v = self._sum()
            if self._peek() not in (")", "}"):
                raise ValueError("unbalanced")
            self.i += 1
            return v
        if tok == "-":
            return -self._atom()
        return float(tok)


def _huge(expr: str) -> bool:
    """True when a numeric sub-expression is a power tower or factorial too large to evaluate."""
    try:
        parser = _Numeric(expr)
        value = parser.value()
    except (ValueError, IndexError, RecursionError, OverflowError):
        return False
    return parser.max_exponent > MAX_POW_EXPONENT or math.isinf(value) and "^" in expr


def is_hostile(answer: str) -> bool:
    """True for answers sympy cannot handle within the bound: too long, too deep, astronomically large."""
    if len(answer) > MAX_ANSWER_CHARS:
        return True
    depth = 0
    for ch in answer:
        if ch in "{(":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return True
        elif ch in "})":
            depth = max(0, depth - 1)
    if answer.count("^") >= 2 and _huge(_norm(answer)):
        return True
    for m in re.finditer(r"!", answer):
        head = answer[: m.start()].rstrip()
        if head.endswith((")", "}")):
            opener = "(" if head.endswith(")") else "{"
            depth, j = 0, len(head) - 1
            while j >= 0:
                depth += {")": 1, "}": 1, "(": -1, "{": -1}.get(head[j], 0)
                if depth == 0 and head[j] == opener:
                    break
                j -= 1
            arg = head[j + 1 : -1]
        else:
            arg = re.search(r"[\d.]*$", head).group()
        try:
            parser = _Numeric(_norm(arg))
            if parser.value() > MAX_FACTORIAL or parser.max_exponent > MAX_POW_EXPONENT:
                return True
        except (ValueError, IndexError, RecursionError, OverflowError):
            continue
    return False


# ---------------------------------------------------------------- math_verify helper processes
#
# Terms.  The *zygote* is one helper process per caller process: it imports math_verify once, warms it up
# and forks a *worker* on request, so a new or replacement worker is ready in milliseconds instead of the
# import's second.  A worker verifies one answer at a time in its main thread.  An answer's *verification
# time* is the CPU time its worker spends on it: the wait for a worker, a replacement's start and other
# answers' load are not counted, and an answer whose worker dies of something else is retried on another.
# At most `size` workers run at once.  The places go to the answers that have had the least CPU: a new
# answer waits only for those that have run less than FAST_SLICE_S, and an answer past that yields its place
# to one that has had QUANTUM_S less (its worker stopped with SIGSTOP, which stops its CPU clock as well),
# so ordinary answers are never held up by hostile ones, and hostile ones share what is left.  No helper outlives the caller: the zygote leads
# its own process group, watches its parent and kills the group once the parent is gone; a worker dies with
# the zygote (PR_SET_PDEATHSIG).  Linux only (SOCK_SEQPACKET, SCM_RIGHTS, /proc); elsewhere CPU time is
# approximated by wall time.


def _die_with_parent(libc: Any) -> None:
    try:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: this process dies with its parent
    except AttributeError:
        pass


def _readable(sock: socket.socket, wait: float) -> bool:
    """True when sock has a message (or its peer is gone) within `wait` seconds; poll, as fds may exceed 1024."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(max(0, math.ceil(wait * 1000))))


def _watch_parent(parent: int) -> None:
    """Zygote thread: once the caller is gone, kill the zygote and every worker (one process group)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


APART = 1e-6  # relative gap (and absolute, below 1) between two values that math_verify never calls equal


class _Apart:
    """Worker: True when math_verify's verify(gold, pred) is sure to be False, found without sympy's simplify.

    A near miss costs verify most of its time (simplify of the difference, which cannot reach 0).  For two
    parsed values that are plain expressions (no relation, set, tuple, matrix, lone symbol, percent, integral,
    sum, product, limit or derivative), verify is True only through equal printing, equal values to 6 decimals
    or to 15 digits, or a difference that simplifies to 0; each needs the values to agree wherever they are
    defined.  So where both, evaluated to 30 digits with every letter (a real symbol, as math_verify's parser
    makes them) set to the same positive rational, differ by more than APART, verify says False.  Everything
    else is left to verify."""

    def __init__(self) -> None:
        import sympy

        self.sympy = sympy
        self.plain = sympy.Symbol("t").assumptions0, sympy.Symbol("t", real=True).assumptions0
        self.kinds = (sympy.Symbol, sympy.MatrixBase, sympy.matrices.expressions.MatrixExpr)
        # values evalf finds by quadrature or series, with no bound on the error: left to verify
        self.inexact = (sympy.Integral, sympy.Sum, sympy.Product, sympy.Limit, sympy.Derivative)
        self.values: dict[str, Any] = {}  # one positive rational per letter, the same in gold and answer

    def __call__(self, golds: list, preds: list) -> bool:
        for gold in golds:
            for pred in preds:
                if isinstance(gold, str) and isinstance(pred, str):
                    if gold.strip() and gold.strip() == pred.strip():  # verify's own rule for two strings
                        return False
                elif not isinstance(gold, str) and not isinstance(pred, str):
                    if not self._apart(gold, pred):
                        return False
                # a string and an expression: verify never calls them equal
        return True

    def _number(self, expr: Any) -> complex | None:
        sympy = self.sympy
        if (
            not isinstance(expr, sympy.Expr)
            or isinstance(expr, self.kinds)
            or expr.has(sympy.UnevaluatedExpr, *self.inexact)
        ):
            return None
        point = {}
        for symbol in expr.free_symbols:
            if not isinstance(symbol, sympy.Symbol) or symbol.assumptions0 not in self.plain:
                return None  # an integer or positive letter: the point may be outside its domain
            name = symbol.name
            if name not in self.values:  # 1.3, 1.7, 2.1, ...: no MATH answer is built on these
                self.values[name] = sympy.Rational(13 + 4 * len(self.values), 10) + sympy.Rational(1, 977)
            point[symbol] = self.values[name]
        value = complex((expr.subs(point) if point else expr).evalf(30))
        return value if math.isfinite(value.real) and math.isfinite(value.imag) else None

    def _apart(self, gold: Any, pred: Any) -> bool:
        try:
            a, b = self._number(gold), self._number(pred)
        except Exception:  # noqa: BLE001 - not a number here: verify decides
            return False
        if a is None or b is None:
            return False
        return abs(a - b) > APART * max(1.0, abs(a), abs(b))


def _two_stage_parsing(converter: Any = None) -> bool:
    """Zygote: math_verify's LaTeX parser (latex2sympy2_extended's ANTLR grammar) tries SLL prediction first and
    falls back to its own full LL on a syntax error; False where its classes are not as expected (left alone).

    ANTLR's SLL mode either returns the parse tree LL prediction returns or reports a syntax error (PredictionMode
    SLL in the ANTLR runtime), so with the fallback every parse, and every verdict, is what it was; the LL part,
    context-full prediction, is most of a parse's time (9.3 ms a parse against 4.0 ms over 4,033 strings of the
    test sets, the same result for every one).  converter: the class to change (the tests pass a subclass)."""
    try:
        from antlr4.atn.PredictionMode import PredictionMode
        from antlr4.error.ErrorListener import ErrorListener

        if converter is None:
            from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy as converter
        create, parse = converter.create_parser, converter.parse
    except (ImportError, AttributeError):
        return False

    class SLLFailed(Exception):
        """A syntax error under SLL prediction: the input is wrong, or needs full LL; LL decides which."""

    class Bail(ErrorListener):
        def syntaxError(self, recognizer, offendingSymbol, line, column, msg, e):  # noqa: N802, N803 - ANTLR's
            raise SLLFailed

    def create_parser(self: Any, latex_str: str) -> Any:
        parser = create(self, latex_str)
        if getattr(self, "_sll", False):
            parser._interp.predictionMode = PredictionMode.SLL
            parser.removeErrorListeners()
            parser.addErrorListener(Bail())
        return parser

    def parse_two_stage(self: Any, latex_str: str) -> Any:
        self._sll = True
        try:
            return parse(self, latex_str)
        except SLLFailed:
            pass
        finally:
            self._sll = False
        return parse(self, latex_str)  # as latex2sympy2_extended parses it

    converter.create_parser, converter.parse = create_parser, parse_two_stage
    return True


def _serve_answers(sock: socket.socket) -> None:
    """Worker main loop: one JSON request per message, one JSON reply per message."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT, resource.RLIM_INFINITY))
    except (ImportError, ValueError, OSError):
        pass
    from functools import lru_cache

    from math_verify import parse, verify

    parse_cached = lru_cache(maxsize=4096)(parse)
    apart = _Apart()

    def same(gold: list, pred: list) -> bool:
        return not apart(gold, pred) and verify(gold, pred)

    while True:
        message = sock.recv(1 << 20)
        if not message:
            return
        try:
            req = json.loads(message)
            answer = req["answer"]
            pred = parse_cached("\\boxed{" + answer + "}" if req["boxed"] else answer)
            truths = req["truths"]  # None: the answer is known right, only the other boxes are in doubt
            equal = truths is None or any(same(parse_cached("\\boxed{" + t + "}"), pred) for t in truths)
            # every other box must hold the same value as the answer
            equal = equal and all(
                same(pred, parse_cached("\\boxed{" + o + "}")) for o in req.get("others", ())
            )
            reply = {"equal": bool(equal)}
        except Exception as exc:  # noqa: BLE001 - a bad answer is a wrong answer, never a crash
            reply = {"equal": False, "error": repr(exc)[:200]}
        reply["cpu"] = time.process_time()
        sock.send(json.dumps(reply).encode())


_WARM_UP = (  # (truth, answer) pairs that take math_verify's parser and sympy through their common paths
    ("x^2+7x+10", "(x+2)(x+5)"),
    ("\\frac{\\sqrt{8}}{2}", "\\sqrt{2}"),
    ("(3,-1)", "(3, -1)"),
    ("\\frac{3\\pi}{4}", "3\\pi/4"),
    ("[0,1)", "x \\in [0, 1)"),
    ("\\text{(B)}", "B"),
    ("2^{10}", "1024"),
    ("x=2", "2"),
)


def _serve(control_fd: int, caller: int) -> None:
    """Zygote main loop: import math_verify, then fork a worker for each request on the control socket."""
    control = socket.socket(fileno=control_fd)
    threading.Thread(target=_watch_parent, args=(caller,), daemon=True).start()
    warnings.simplefilter("ignore")  # also Python 3.12's note on forking with the (lock-free) watcher running
    try:
        import ctypes
        import logging

        logging.disable(logging.WARNING)  # latex2sympy2_extended logs a deprecation on every parse
        libc = ctypes.CDLL(None)
        from math_verify import parse, verify

        _two_stage_parsing()  # before the warm-up and the first fork: every worker parses this way
    except Exception as exc:  # noqa: BLE001 - reported to the caller, which says so once
        fatal = isinstance(exc, ImportError | SyntaxError)
        control.send(json.dumps({"ready": False, "fatal": fatal, "error": repr(exc)[:300]}).encode())
        # Read the caller's "fork" before exiting: a Unix socket closed with unread data resets the
        # connection, and the caller's read then loses the message above (ECONNRESET instead of why).
        control.settimeout(5.0)
        try:
            control.recv(64)
        except OSError:
            pass
        return
    # math_verify's own limits are SIGALRM wall-clock timers: under load they would fail a correct answer
    # for another's CPU use.  The caller bounds each answer's CPU time instead.
    signal.alarm = lambda seconds: 0
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    gc.freeze()  # objects made so far stay untouched by workers' collections: their pages stay shared
    control.send(b'{"ready": true}')
    forked = warm = False
    while True:
        message = control.recv(64)
        if not message:
            return  # the caller closed the pool
        if forked and not warm:
            # the first worker serves the first call at once, cold; the warm-up waits until that call is
            # done ("warm") or another worker is wanted, so that the two do not share the CPU
            for truth, answer in _WARM_UP:
                try:
                    verify(parse("\\boxed{" + truth + "}"), parse("\\boxed{" + answer + "}"))
                except Exception:  # noqa: BLE001, S110 - warming up is best effort
                    pass
            gc.freeze()
            warm = True
        if message == b"fork":
            _fork_worker(control, libc, warm)
            forked = True


def _fork_worker(control: socket.socket, libc: Any, warm: bool) -> None:
    """Zygote: fork one worker and hand the caller its socket (and pidfd) over the control socket."""
    zygote = os.getpid()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            control.close()
            mine.close()
            _die_with_parent(libc)
            if os.getppid() == zygote:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _serve_answers(theirs)
        finally:
            os._exit(0)
    theirs.close()
    fds = [mine.fileno()]
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
            fds.append(pidfd)
        except OSError:
            pass
    socket.send_fds(control, [json.dumps({"pid": pid, "warm": warm}).encode()], fds)
    mine.close()
    if pidfd is not None:
        os.close(pidfd)


class _WorkerDied(Exception):
    """A helper process exited or stopped answering for a reason that is not the answer's."""


class _Unavailable(Exception):
    """math_verify cannot run in this Python (not installed, does not import)."""


class MathVerifyUnavailable(RuntimeError):
    """math_verify cannot be imported or run here, so no answer that needs sympy could be scored."""


def _unavailable_message(why: str) -> str:
    return (
        f"new_math_reward needs math_verify in {sys.executable} (Python {sys.version.split()[0]}), and {why}; "
        f"install it with: {sys.executable} -m pip install '{MATH_VERIFY_REQUIREMENT}' "
        f"(it needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]})"
    )


def _require_math_verify(workers: int | None) -> None:
    """Raise MathVerifyUnavailable unless this Python is new enough and math_verify imports in the helpers."""
    if sys.version_info < MIN_PYTHON:
        need = f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}"
        raise MathVerifyUnavailable(
            f"new_math_reward needs Python >= {need}, as math_verify does; {sys.executable} is Python "
            f"{sys.version.split()[0]}: run it with Python >= {need}, after python3 -m pip install "
            f"'{MATH_VERIFY_REQUIREMENT}' there"
        )
    pool = _get_pool(workers)
    if pool.checked:
        return
    if importlib.util.find_spec("math_verify") is None:
        raise MathVerifyUnavailable(_unavailable_message("it is not installed there"))
    pool.check()


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, None where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class _Worker:
    """One forked math_verify process; used by one thread at a time."""

    def __init__(self, pid: int, sock: socket.socket, pidfd: int | None, warm: bool) -> None:
        self.pid, self.sock, self.pidfd = pid, sock, pidfd
        self.warm = warm  # forked after the zygote's warm-up: its first answer pays no parser set-up
        self.cpu_base = 0.0  # the worker's CPU time when its current request began
        self.golds: set[tuple] = set()  # the truths it has been sent (its parse cache holds them)

    def fresh(self) -> bool:
        """True while the idle worker is alive: an idle worker's socket has nothing to say until it dies."""
        try:
            return not _readable(self.sock, 0)
        except (OSError, ValueError):
            return False

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendmsg([data], [], socket.MSG_NOSIGNAL)
        except (OSError, ValueError) as exc:
            raise _WorkerDied(f"worker gone ({exc})") from exc

    def reply(self, wait: float) -> dict | None:
        """The worker's reply, None when there is none within `wait` seconds."""
        try:
            if not _readable(self.sock, wait):
                return None
            message = self.sock.recv(1 << 16)
        except (OSError, ValueError) as exc:  # ValueError: the socket was closed under us (fd -1)
            raise _WorkerDied(f"worker gone ({exc})") from exc
        if not message:
            raise _WorkerDied("worker exited")
        reply = json.loads(message)
        self.cpu_base = float(reply.get("cpu", self.cpu_base))
        return reply

    def cpu_used(self) -> float | None:
        now = _cpu_seconds(self.pid)
        return None if now is None else max(0.0, now - self.cpu_base)

    def signal(self, signum: int) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            else:
                os.kill(self.pid, signum)
        except OSError:
            pass

    def kill(self) -> None:
        """SIGKILL, and where a pidfd says when, return once the process is gone."""
        self.signal(signal.SIGKILL)
        if self.pidfd is not None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            poller.poll(1000)
        self.close()

    def close(self) -> None:
        self.sock.close()
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
            self.pidfd = None


class _Zygote:
    """The caller's handle on the zygote process; fork() is serialised by its lock."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    _SERVE_FLAG,
                    str(theirs.fileno()),
                    str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # its own process group: the caller's Ctrl-C is the caller's to handle
            )
        finally:
            theirs.close()
        self.sock = mine
        self.lock = threading.Lock()
        self.ready = False

    def _message(self, deadline: float) -> tuple[dict, list[int]]:
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0 or not _readable(self.sock, remaining):
                raise _WorkerDied("math_verify zygote did not answer in time")
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1024, 2)
        except (OSError, ValueError) as exc:  # ValueError: another thread closed the socket (fd -1)
            raise _WorkerDied(f"math_verify zygote gone ({exc})") from exc
        if not data:
            raise _WorkerDied("math_verify zygote exited")
        return json.loads(data), fds

    def _read_ready(self, deadline: float) -> None:
        """Read the zygote's first message (it has imported math_verify, or says why not); the lock is held."""
        if not self.ready:
            status, _ = self._message(deadline)
            if not status.get("ready"):
                error = status.get("error", "no reason given")
                raise (_Unavailable if status.get("fatal") else _WorkerDied)(error)
            self.ready = True

    def wait_ready(self) -> None:
        """Return once the zygote has imported math_verify; _Unavailable when it cannot, _WorkerDied if it died."""
        with self.lock:
            self._read_ready(time.monotonic() + ZYGOTE_STARTUP_TIMEOUT_S)

    def fork(self) -> _Worker:
        """A new worker; raises _Unavailable when math_verify cannot import, _WorkerDied when the zygote died."""
        with self.lock:
            deadline = time.monotonic() + ZYGOTE_STARTUP_TIMEOUT_S
            gone = None
            try:  # sent before the zygote is ready, so it forks before it starts warming up
                self.sock.sendmsg([b"fork"], [], socket.MSG_NOSIGNAL)
            except (OSError, ValueError) as exc:
                gone = exc  # it may have said why before it exited: read that first
            self._read_ready(deadline)
            if gone is not None:
                raise _WorkerDied(f"math_verify zygote gone ({gone})")
            status, fds = self._message(deadline)
        if not fds:
            raise _WorkerDied("math_verify zygote sent no worker")
        pidfd = fds[1] if len(fds) > 1 else None
        return _Worker(status["pid"], socket.socket(fileno=fds[0]), pidfd, bool(status.get("warm")))

    def nudge(self) -> None:
        """Tell the zygote the cold first call is done, so it may warm up (skipped while a fork is asked)."""
        if self.lock.acquire(blocking=False):
            try:
                self.sock.sendmsg([b"warm"], [], socket.MSG_NOSIGNAL)
            except OSError:
                pass
            finally:
                self.lock.release()

    def kill(self) -> None:
        if self.proc.poll() is None:  # not reaped, so its process group id is still its own
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class _Pool:
    """The zygote and workers shared by every thread of one process; created on first use."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pid = os.getpid()
        self.cond = threading.Condition()  # guards every field below
        self.running = 0  # answers whose workers may run (at most size)
        self.waiting: list[list] = []  # answers waiting for a running place, see _acquire
        self.arrivals = itertools.count()
        self.live = threading.BoundedSemaphore(max(MAX_LIVE_WORKERS, 8 * size))
        self.idle: list[_Worker] = []
        self.busy: set[_Worker] = set()
        self.zygote: _Zygote | None = None
        self.zygote_lock = threading.Lock()
        self.fatal: str | None = None
        self.checked = False  # math_verify seen to import in the zygote
        self.closed = False
        atexit.register(self.close)

    def _get_zygote(self) -> _Zygote:
        with self.zygote_lock:
            zygote = self.zygote
            if zygote is None or zygote.proc.poll() is not None:
                if zygote is not None:
                    zygote.kill()
                if self.closed:
                    raise _WorkerDied("pool closed")
                zygote = self.zygote = _Zygote()
            return zygote

    def _take(self, gold: tuple | None = None) -> _Worker:
        """An idle worker (one that has parsed gold already where there is one), else a new one."""
        with self.cond:
            if gold is not None:  # its parse cache holds the truth: it need not parse it again
                for at in range(len(self.idle) - 1, -1, -1):
                    if gold in self.idle[at].golds:
                        self.idle.append(self.idle.pop(at))
                        break
            while self.idle:
                worker = self.idle.pop()
                if worker.fresh():
                    self.busy.add(worker)
                    return worker
                worker.kill()  # died while idle: not this answer's concern
        zygote = self._get_zygote()
        try:
            worker = zygote.fork()
        except _WorkerDied:
            with self.zygote_lock:
                if self.zygote is zygote:
                    zygote.kill()
                    self.zygote = None
            raise
        except _Unavailable as exc:
            self.fatal = str(exc)
            raise
        with self.cond:
            self.busy.add(worker)
        return worker

    def _done(self, worker: _Worker, reusable: bool) -> None:
        with self.cond:
            self.busy.discard(worker)
            if reusable and not self.closed:
                self.idle.append(worker)
                return
        worker.kill()

    def _acquire(self, attained: float) -> None:
        """Wait for a running place; the waiter that has had the least CPU goes first."""
        with self.cond:
            if self.running < self.size and not self.waiting:
                self.running += 1
                return
            entry = [attained, next(self.arrivals), False]  # [CPU so far, arrival, granted]
            self.waiting.append(entry)
            try:
                while not entry[2]:
                    self.cond.wait()
            except BaseException:
                if entry[2]:
                    self._release_locked()
                else:
                    self.waiting.remove(entry)
                raise

    def _release_locked(self) -> None:
        if self.waiting:
            best = min(self.waiting)
            self.waiting.remove(best)
            best[2] = True  # the place passes straight to it
            self.cond.notify_all()
        else:
            self.running -= 1

    def _release(self) -> None:
        with self.cond:
            self._release_locked()

    def _should_yield(self, attained: float) -> bool:
        with self.cond:
            return bool(self.waiting) and min(self.waiting)[0] + QUANTUM_S <= attained

    def _attempt(self, data: bytes, budget: float, gold: tuple | None = None) -> tuple[str, float]:
        """One try on one worker: ('equal' | 'different' | 'timeout' | 'cold' | 'died' | 'nostart', CPU seconds)."""
        with self.live:
            self._acquire(0.0)
            holding, worker, used, reusable = True, None, 0.0, False
            try:
                try:
                    worker = self._take(gold)
                except _WorkerDied:  # no worker could be had (the zygote died): not the answer's doing
                    return "nostart", 0.0
                if gold is not None:
                    if len(worker.golds) >= WORKER_GOLDS:
                        worker.golds.clear()
                    worker.golds.add(gold)
                worker.send(data)
                running = 0.0  # wall time the worker has been let run on this answer
                while True:
                    # CPU time grows no faster than wall time: sleep until the next check could be due
                    due = FAST_SLICE_S if used < FAST_SLICE_S else used + QUANTUM_S
                    start = time.monotonic()
                    reply = worker.reply(min(POLL_MAX_S, max(POLL_MIN_S, min(due, budget) - used)))
                    running += time.monotonic() - start
                    if reply is not None:
                        reusable = worker.warm  # a cold worker served the first call; warm ones replace it
                        if not worker.warm and self.zygote is not None:
                            self.zygote.nudge()
                        return ("equal" if reply.get("equal") else "different"), used
                    cpu = worker.cpu_used()
                    used = running if cpu is None else cpu
                    if used >= budget or running > WALL_BACKSTOP_FACTOR * budget:
                        return ("timeout" if worker.warm else "cold"), used
                    if used >= FAST_SLICE_S and self._should_yield(used):
                        worker.signal(signal.SIGSTOP)  # its CPU clock stops too
                        holding = False
                        self._release()
                        try:
                            self._acquire(used)
                            holding = True
                        finally:
                            worker.signal(signal.SIGCONT)
            except _WorkerDied:
                return "died", used
            finally:
                if worker is not None:
                    self._done(worker, reusable)
                if holding:
                    self._release()

    def verify(self, request: dict, timeout: float, gold: tuple | None = None) -> tuple[bool | None, bool]:
        """(equal, timed_out); equal is None when math_verify could not be run on the answer.  gold: the
        truths it is checked against, to send it to an idle helper that has parsed them already."""
        data = json.dumps(request).encode()
        spent = 0.0
        deaths = starts = 0
        while deaths < MAX_ATTEMPTS:
            if self.fatal is not None:
                return None, False
            try:
                outcome, used = self._attempt(data, timeout - spent, gold)
            except _Unavailable:
                return None, False
            if outcome == "nostart":
                # A helper killed before it could take the answer costs the answer nothing; only a
                # zygote that keeps dying at start (MAX_STARTS times in a row) gives up.
                starts += 1
                if starts >= MAX_STARTS:
                    return None, False
                time.sleep(min(0.05 * starts, 0.5))
                continue
            if outcome == "timeout":
                return False, True
            if outcome == "cold":  # the bound went on the parser's set-up: try again on a warm worker
                deaths += 1
                continue
            if outcome != "died":
                return outcome == "equal", False
            deaths += 1
            spent += used  # the worker died of something else: retry with what is left of the bound
            if spent >= timeout:
                return False, True
        return None, False

    def check(self) -> None:
        """Raise MathVerifyUnavailable unless math_verify imports in the helpers (waits for the zygote once)."""
        if self.fatal is None and not self.checked:
            zygote = self._get_zygote()
            try:
                zygote.wait_ready()
                self.checked = True
            except _Unavailable as exc:
                self.fatal = str(exc)
            except _WorkerDied:
                pass  # a zygote killed while it starts is replaced by the next answer, as any helper death
        if self.fatal is not None:
            raise MathVerifyUnavailable(_unavailable_message(f"it does not import there: {self.fatal}"))

    def pids(self) -> dict[str, list[int]]:
        """Process ids by state (for tests and the benchmark)."""
        with self.cond:
            zygote = self.zygote
            return {
                "zygote": [zygote.proc.pid] if zygote is not None and zygote.proc.poll() is None else [],
                "idle": [w.pid for w in self.idle],
                "busy": [w.pid for w in self.busy],
            }

    def close(self) -> None:
        if os.getpid() != self.pid:  # a forked child inherits this atexit hook; the helpers are not its own
            return
        with self.cond:
            self.closed = True
            workers, self.idle = self.idle, []
        for worker in workers:
            worker.close()
        with self.zygote_lock:
            zygote, self.zygote = self.zygote, None
        if zygote is not None:
            zygote.kill()  # and with it, through the process group, every worker still running


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()
_POOL_PID: int | None = None
_CACHE: OrderedDict[tuple, bool] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 65_536
_WARNED: set[str] = set()


def _default_workers() -> int:
    env = os.environ.get("MATH_REWARD_WORKERS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def _get_pool(num_workers: int | None = None) -> _Pool:
    global _POOL, _POOL_LOCK, _POOL_PID
    if _POOL_PID != os.getpid():  # first use, or a forked child: never share the parent's helpers
        _POOL_LOCK, _POOL, _POOL_PID = threading.Lock(), None, os.getpid()
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _Pool(num_workers or _default_workers())
        return _POOL


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(f"new_math_reward: {message}", RuntimeWarning, stacklevel=4)


def shutdown() -> None:
    """Stop the helper processes (they are also stopped at exit); the next call starts new ones."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


def _verify(
    answer: _Answer,
    truths: tuple[str, ...],
    timeout: float,
    workers: int | None,
    caller_only: bool = False,
    gold: _Gold | None = None,
) -> tuple[bool, bool] | None:
    """(correct, timed_out) through the cache, the cheap verdicts and the worker pool; with caller_only, None
    where the answer needs the pool.  gold: truths parsed once for every answer that shares them."""
    key = (answer.text, answer.boxed, truths, answer.others)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key], False
    gold = gold if gold is not None and gold.texts == truths else _Gold(truths)
    verdict = fast_verdict(answer.text, truths, gold.normed)
    timed_out = False
    if verdict is None or verdict and answer.others:
        if is_hostile(answer.text):
            return False, False
        sane = gold.sane
        if not sane:
            return False, False
        if caller_only:
            return None
        pool = _get_pool(workers)
        request = {
            "answer": _for_sympy(answer.text),
            "boxed": answer.boxed,
            "truths": None if verdict else list(sane),
            "others": [_for_sympy(o) for o in answer.others],
        }
        equal, timed_out = pool.verify(request, timeout, sane)
        if equal is None:
            if pool.fatal is not None:  # it stopped importing since the first call (the package was removed)
                pool.check()
            else:
                _warn_once(
                    f"math_verify's worker died {MAX_ATTEMPTS} times on one answer, or could not be started "
                    f"{MAX_STARTS} times in a row; it scores 0"
                )
            return False, False
        if timed_out:
            return False, True  # not cached: a later try may have more time
        verdict = equal
    with _CACHE_LOCK:
        _CACHE[key] = verdict
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return verdict, timed_out


# ---------------------------------------------------------------- public scoring API


def _as_text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    return value.replace("\x00", "")


def _truths(ground_truth: Any) -> tuple[str, ...]:
    """Accepted ground-truth strings: a string, a number, or a list of either."""
    items = ground_truth if isinstance(ground_truth, list | tuple) else [ground_truth]
    out = []
    for item in items[:16]:
        if isinstance(item, int | float | Fraction) and not isinstance(item, bool):
            item = str(item)
        text = _as_text(item)
        if text is None:
            continue
        spans = _boxed_spans(text) if "\\boxed" in text or "\\fbox" in text else []
        text = _canonical(_strip_math(text[spans[-1][0] : spans[-1][1]] if spans else text))
        solutions = _solutions(text) if " or " in text or " and " in text else None
        text = solutions[0] if solutions is not None else text  # 3 or -3: the set, as in an answer
        if text:
            out.append(text)
    return tuple(out)


class _Gold:
    """One prompt's truths, parsed once per step for all the answers that share them (GRPO's n samples): the
    accepted strings, each through _norm, what math_verify's helpers are sent, and whether several values are
    allowed.  Each part is worked out on first use, so a truth no answer needs sympy for is never made ready for
    it."""

    __slots__ = ("texts", "_normed", "_sane", "_several")

    def __init__(self, texts: tuple[str, ...]) -> None:
        self.texts = texts
        self._normed: tuple[str, ...] | None = None
        self._sane: tuple[str, ...] | None = None
        self._several: bool | None = None

    @property
    def normed(self) -> tuple[str, ...]:
        if self._normed is None:
            self._normed = tuple(_norm(t) for t in self.texts)
        return self._normed

    @property
    def sane(self) -> tuple[str, ...]:
        if self._sane is None:
            self._sane = tuple(_for_sympy(t) for t in self.texts if not is_hostile(t))
        return self._sane

    @property
    def several(self) -> bool:
        if self._several is None:
            self._several = _several_allowed(self.texts, self.normed)
        return self._several


class NoGroundTruth(ValueError):
    """The ground truth holds no answer (None, "", a dict, an empty box): a dataset error, never a score of 0."""


def _no_truth_message(ground_truth: Any, where: str = "") -> str:
    shown = repr(ground_truth)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return (
        f"{where}the ground truth {shown} holds no answer: pass the reference answer as a string, a number or a "
        "list of them (verl: reward_model.ground_truth of each data row)"
    )


def _parse_truth(ground_truth: Any) -> _Gold:
    """A ground truth as the scoring reads it; compute_score_batch calls this once per distinct truth.  Raises
    NoGroundTruth when it holds no answer: every response would score 0 and a run would learn from the zeros."""
    gold = _Gold(_truths(ground_truth))
    if not gold.texts:
        raise NoGroundTruth(_no_truth_message(ground_truth))
    return gold


def _truth_key(value: Any) -> tuple | None:
    """A key equal for equal ground truths (1 and 1.0 and True apart), None where there is none."""
    if isinstance(value, list | tuple):
        keys = tuple(_truth_key(v) for v in value)
        return None if None in keys else ("seq", keys)
    if isinstance(value, str | bytes | int | float | Fraction) or value is None:
        return (type(value).__name__, value)
    return None


def _zero(**extra: Any) -> dict[str, Any]:
    result = {"score": 0.0, "accuracy": 0.0, "format": 0.0, "cot": 0.0, "correct": False, "timed_out": False}
    result.update(extra)
    return result


class _Prepared(NamedTuple):
    answer: _Answer | None
    truths: tuple[str, ...]
    fmt: int = 0
    cot: int = 0
    gold: _Gold | None = None


def _prepare(solution_str: Any, ground_truth: Any, gold: _Gold | None = None) -> _Prepared:
    """The answer read from solution_str and the truths; gold, where given, is ground_truth already parsed."""
    response = _as_text(solution_str)
    gold = gold if gold is not None else _parse_truth(ground_truth)
    truths = gold.texts
    if response is None or not truths:
        return _Prepared(None, truths)
    answer = extract_answer(response)
    if answer.text is None or answer.ambiguous:
        return _Prepared(None, truths)
    if not gold.several and _hedged(answer.scope):  # 4 but maybe 5, at least 5: see _hedged
        return _Prepared(None, truths)
    return _Prepared(answer, truths, format_milli(response), cot_milli(response), gold)


def _finish(prep: _Prepared, correct: bool, timed_out: bool) -> dict[str, Any]:
    if not correct:
        return _zero(timed_out=timed_out)
    return {
        "score": (_ACC_MILLI + prep.fmt + prep.cot) / 1000,
        "accuracy": _ACC_MILLI / 1000,
        "format": prep.fmt / 1000,
        "cot": prep.cot / 1000,
        "correct": True,
        "timed_out": False,
    }


def _options(kwargs: dict[str, Any]) -> tuple[float, int | None]:
    timeout = kwargs.get("timeout", os.environ.get("MATH_REWARD_TIMEOUT", DEFAULT_TIMEOUT_S))
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        timeout = DEFAULT_TIMEOUT_S
    if not timeout > 0 or math.isinf(timeout):
        timeout = DEFAULT_TIMEOUT_S
    workers = kwargs.get("num_workers")
    return timeout, workers if isinstance(workers, int) and workers > 0 else None


def compute_score_dict(
    data_source: Any = None,
    solution_str: Any = None,
    ground_truth: Any = None,
    extra_info: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response: ``score`` plus ``accuracy``, ``format``, ``cot``, ``correct``, ``timed_out``.

    Raises MathVerifyUnavailable when math_verify cannot be imported or run, and NoGroundTruth (a ValueError)
    when the ground truth holds no answer (None, "", an empty box); never for any response.
    """
    timeout, workers = _options(kwargs)
    _require_math_verify(workers)
    try:
        prep = _prepare(solution_str, ground_truth)
        if prep.answer is None:
            return _zero()
        correct, timed_out = _verify(prep.answer, prep.truths, timeout, workers, gold=prep.gold)
        return _finish(prep, correct, timed_out)
    except (MathVerifyUnavailable, NoGroundTruth):
        raise
    except Exception:  # noqa: BLE001 - a reward must never take a training step down
        return _zero()


def compute_score(
    data_source: Any = None,
    solution_str: Any = None,
    ground_truth: Any = None,
    extra_info: Any = None,
    **kwargs: Any,
) -> float:
    """Score one response in [0, 1]; verl's ``custom_reward_function`` contract."""
    return compute_score_dict(data_source, solution_str, ground_truth, extra_info, **kwargs)["score"]


def compute_score_batch(
    data_sources: Any = None,
    solution_strs: Any = None,
    ground_truths: Any = None,
    extra_infos: Any = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Score a batch over the worker processes; verl's ``reward_manager=batch`` contract.  Raises as
    compute_score_dict does, before scoring anything, naming the first item whose ground truth holds no answer."""
    timeout, workers = _options(kwargs)
    _require_math_verify(workers)
    try:
        responses = list(solution_strs or [])
        truths = list(ground_truths or [])
    except Exception:  # noqa: BLE001
        return []
    truths += [None] * (len(responses) - len(truths))
    results: list[dict[str, Any]] = [_zero() for _ in responses]
    preps: list[_Prepared | None] = []
    golds: dict[tuple, _Gold] = {}  # each distinct truth parsed once for the step (GRPO: n answers share one)
    for n, (response, truth) in enumerate(zip(responses, truths, strict=False)):
        try:
            key = _truth_key(truth)
            gold = golds.get(key) if key is not None else None
            if gold is None:
                gold = _parse_truth(truth)
                if key is not None:
                    golds[key] = gold
            preps.append(_prepare(response, truth, gold))
        except NoGroundTruth:
            raise NoGroundTruth(_no_truth_message(truth, f"item {n}: ")) from None
        except Exception:  # noqa: BLE001
            preps.append(None)

    def score(i: int, caller_only: bool = False) -> bool:
        """Score answer i; False (nothing done) where caller_only and it needs the pool."""
        prep = preps[i]
        if prep is None or prep.answer is None:
            return True
        try:
            verdict = _verify(prep.answer, prep.truths, timeout, workers, caller_only, prep.gold)
            if verdict is None:
                return False
            results[i] = _finish(prep, *verdict)
        except MathVerifyUnavailable:
            raise
        except Exception:  # noqa: BLE001
            results[i] = _zero()
        return True

    # what the cache and the cheap checks decide is decided here, in this thread: no thread pool for it
    pending = [i for i in range(len(responses)) if not score(i, caller_only=True)]
    if pending:
        # one truth's answers one after another, so that they meet the helper that has already parsed it
        first: dict[int, int] = {}
        pending.sort(key=lambda i: first.setdefault(id(preps[i].gold), i))
        # more callers than running places, so that ordinary answers pass a slow one instead of queueing
        threads = min(len(pending), BATCH_THREADS_PER_WORKER * (workers or _default_workers()))
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="math-reward") as executor:
            list(executor.map(score, pending))
    return results


# ---------------------------------------------------------------- TRL


TRL_TRUTH_COLUMNS = (
    "ground_truth",
    "solution",
    "answer",
)  # the dataset column holding the truth, first found
# What GRPOTrainer passes besides the dataset's columns (0.29: prompts, completions, completion_ids,
# trainer_state; 1.x adds log_extra, log_metric, and environments when it has some), and trl_reward's own
# options: none of them is a column, so the missing-truth error never lists them as one.
TRL_NOT_COLUMNS = frozenset(
    {
        "prompts",
        "completions",
        "completion_ids",
        "trainer_state",
        "log_extra",
        "log_metric",
        "environments",
        "timeout",
        "num_workers",
    }
)


def _completion_text(completion: Any) -> Any:
    """A TRL completion as text: a string, or the assistant messages of a conversational one, joined."""
    if not isinstance(completion, list):
        return completion
    parts = []
    for message in completion:
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(content if isinstance(content, str) else "")
    return "".join(parts)


def _usable_truth(value: Any) -> bool:
    """A ground truth that states an answer: a value, or a solution with a \\boxed{} (not prose without one)."""
    truths = _truths(value)
    if not truths:
        return False
    text = _as_text(value) or ""
    boxed = "\\boxed" in text or "\\fbox" in text
    return boxed or all(len(t) <= MAX_ANSWER_CHARS and len(_PROSE_RE.findall(t)) <= 4 for t in truths)


def trl_reward(completions: list, **kwargs: Any) -> list[float]:
    """TRL's ``GRPOTrainer`` reward function: one float per completion (plain or conversational).

    TRL passes the dataset's other columns as keyword arguments; the truth is read from the first of
    ``ground_truth``, ``solution`` (a MATH solution's last ``\\boxed{}``), ``answer`` or verl's ``reward_model``
    whose every row holds an answer (a solution without a box is skipped); with none, a ValueError naming the
    columns seen.
    ``timeout`` and ``num_workers`` may be bound with ``functools.partial``.
    """
    candidates = {name: list(kwargs[name]) for name in TRL_TRUTH_COLUMNS if name in kwargs}
    if "reward_model" in kwargs:
        candidates["reward_model"] = [
            rm.get("ground_truth") if isinstance(rm, dict) else None for rm in kwargs["reward_model"]
        ]
    # the first column whose every row holds an answer: a MATH solution without a \boxed{} is prose, not one
    column = next((name for name, values in candidates.items() if all(map(_usable_truth, values))), None)
    if column is None:
        # a callable is one of TRL's hooks (log_extra, log_metric, any later one), never a column's values
        columns = sorted(k for k, v in kwargs.items() if k not in TRL_NOT_COLUMNS and not callable(v))
        unusable = f" ({', '.join(candidates)}: not every row holds an answer)" if candidates else ""
        raise ValueError(
            "trl_reward needs the ground truth in a dataset column named "
            f"{', '.join(TRL_TRUTH_COLUMNS)} or reward_model{unusable}; the dataset's columns are {columns}"
        )
    truths = candidates[column]
    if len(truths) != len(completions):
        raise ValueError(f"trl_reward got {len(completions)} completions and {len(truths)} ground truths")
    sources = kwargs.get("data_source") or [None] * len(completions)
    options = {k: kwargs[k] for k in ("timeout", "num_workers") if k in kwargs}
    results = compute_score_batch(
        sources, [_completion_text(c) for c in completions], truths, None, **options
    )
    return [float(r["score"]) for r in results]


# ---------------------------------------------------------------- command line


def _read_jsonl(path: str) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line."""
    if path == "-" and sys.stdin is None:
        raise ValueError("standard input is closed; pass a file name or pipe the JSONL in")
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    rows = []
    with stream:
        n = 0
        try:
            for n, line in enumerate(stream, 1):  # noqa: B007 - n names the line an error is on
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not JSON ({exc.msg}); fix or drop that line") from exc
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{n}: expected a JSON object per line")
                rows.append((n, row))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}:{n + 1}: not UTF-8 text ({exc.reason})") from exc
    return rows


CLI_RESPONSE_KEYS = ("response", "solution_str", "output", "completion")
CLI_TRUTH_KEYS = ("ground_truth", "answer", "reward_model.ground_truth")


def _row_fields(row: dict, where: str = "") -> tuple[Any, Any]:
    """(response, truth) of one JSONL object; a missing key is an error naming the keys read, never a silent 0."""
    response = next((row[k] for k in CLI_RESPONSE_KEYS if k in row), None)
    truth = row.get("ground_truth", row.get("answer"))
    if truth is None and isinstance(row.get("reward_model"), dict):
        truth = row["reward_model"].get("ground_truth")
    for name, value, keys in (
        ("response", response, CLI_RESPONSE_KEYS),
        ("ground truth", truth, CLI_TRUTH_KEYS),
    ):
        if value is None:
            raise ValueError(
                f"{where}no {name}: the keys read are {', '.join(keys)}; this line has {sorted(row) or 'none'}"
            )
    if not _truths(truth):
        raise NoGroundTruth(_no_truth_message(truth, where))
    return response, truth


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on standard error (exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _score_file(argv: list[str]) -> int:
    parser = _Parser(
        prog="new_math_reward.py", description="Score MATH responses: accuracy 0.7 + format 0.2 + CoT 0.1."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    score = sub.add_parser(
        "score",
        help="score a JSONL file",
        description=f"Score each line of a JSONL file: the response under one of {', '.join(CLI_RESPONSE_KEYS)}, "
        f"the ground truth under one of {', '.join(CLI_TRUTH_KEYS)} (a line without either, or whose truth "
        "holds no answer, is an error); "
        "print one line per item and a summary (with --json, "
        'one JSON object per item and a last {"summary": ...} object).',
    )
    score.add_argument("file", help="JSONL file, or - for stdin")
    score.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="CPU seconds per answer (default 1)"
    )
    score.add_argument(
        "--workers", type=int, default=None, help="math_verify processes at full speed (default: CPUs, max 8)"
    )
    score.add_argument("--json", action="store_true", help="print JSON Lines: each result, then the summary")
    args = parser.parse_args(argv)
    if not (args.timeout > 0 and math.isfinite(args.timeout)) or (
        args.workers is not None and args.workers < 1
    ):
        parser.error("--timeout must be a number > 0 and --workers >= 1")
    lines = _read_jsonl(args.file)
    rows = [row for _, row in lines]
    fields = [_row_fields(row, f"{args.file}:{n}: ") for n, row in lines]
    start = time.monotonic()
    results = compute_score_batch(
        [r.get("data_source") for r in rows],
        [f[0] for f in fields],
        [f[1] for f in fields],
        timeout=args.timeout,
        num_workers=args.workers,
    )
    elapsed = time.monotonic() - start
    for n, result in enumerate(results):
        if args.json:
            print(json.dumps({"index": n, **result}))
        else:
            print(
                f"{n}\tscore={result['score']:.3f}\taccuracy={result['accuracy']:.1f}\tformat={result['format']:.3f}"
                f"\tcot={result['cot']:.2f}\tcorrect={result['correct']}\ttimed_out={result['timed_out']}"
            )
    count = len(results)
    summary = {
        "items": count,
        "mean_score": round(sum(r["score"] for r in results) / count, 4) if count else 0.0,
        "correct": sum(r["correct"] for r in results),
        "timed_out": sum(r["timed_out"] for r in results),
        "seconds": round(elapsed, 2),
    }
    if args.json:
        print(json.dumps({"summary": summary}))
    else:
        print(
            f"summary: items={count} mean_score={summary['mean_score']:.4f} correct={summary['correct']}/{count} "
            f"timed_out={summary['timed_out']} seconds={elapsed:.2f}"
        )
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: score a JSONL file of responses and ground truths; every error is one line."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_SERVE_FLAG]:
        _serve(int(argv[1]), int(argv[2]))
        return 0
    try:
        return _score_file(argv)
    except KeyboardInterrupt:
        message, status = "interrupted", 130
    except BrokenPipeError:
        try:  # the reader left (| head): keep the interpreter's final flush from failing again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, AttributeError, ValueError):
            pass
        message, status = "standard output closed before the end", 1
    except MathVerifyUnavailable as exc:
        message, status = str(exc), 1
    except (OSError, ValueError) as exc:
        message, status = str(exc), 1
    except Exception as exc:  # noqa: BLE001 - a command line error is one line, never a traceback
        message, status = f"{type(exc).__name__}: {exc}", 1
    if sys.stderr is not None:
        print("error: " + " ".join(message.split()), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
