"""The MATH reward's scoring rules, exact totals, interfaces and command line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REWARD_PATH = Path(__file__).resolve().parents[2] / "llm_rl" / "qwen2_5" / "new_math_reward.py"

STEPS = (
    "Let me work it out.\n"
    "Step 1: Solve the equation for x.\nStep 2: Substitute x back to check.\nStep 3: Therefore the value holds.\n"
)


def load_reward():
    """The reward module loaded from its file, as verl and users load it (shared by the test files)."""
    module = sys.modules.get("new_math_reward")
    if module is None:
        spec = importlib.util.spec_from_file_location("new_math_reward", REWARD_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["new_math_reward"] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reward():
    return load_reward()


def make(answer: str = "\\boxed{1}", think: str = STEPS, before: str = "", after: str = "") -> str:
    """A response in the recipe's format."""
    return f"{before}<think>\n{think}</think>\n<answer>\n{answer}\n</answer>{after}"


def test_perfect_response_scores_exactly_one(reward):
    result = reward.compute_score_dict("lighteval/MATH", make(), "1")
    assert result == {
        "score": 1.0,
        "accuracy": 0.7,
        "format": 0.2,
        "cot": 0.1,
        "correct": True,
        "timed_out": False,
    }
    assert reward.compute_score("lighteval/MATH", make(), "1") == 1.0


def test_wrong_answer_scores_zero_and_counts_nothing_else(reward):
    result = reward.compute_score_dict("lighteval/MATH", make("\\boxed{2}"), "1")
    assert result["score"] == 0.0 and result["format"] == 0.0 and result["cot"] == 0.0
    assert result["correct"] is False


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("0.25", "\\frac{1}{4}"),
        ("\\boxed{0.25}", "\\frac14"),
        ("\\boxed{\\dfrac12}", "\\frac{1}{2}"),
        ("42", "42"),
        ("$-3$", "-3"),
        ("\\boxed{(x+2)(x+5)}", "x^2+7x+10"),
        ("\\boxed{\\frac{\\sqrt{8}}{2}}", "\\sqrt{2}"),
        ("\\boxed{(3, -1)}", "(3,-1)"),
        ("\\boxed{1,000}", "1000"),
    ],
)
def test_semantically_equal_answers_are_correct(reward, answer, truth):
    assert reward.compute_score("s", make(answer), truth) == 1.0


@pytest.mark.parametrize(
    ("answer", "truth"),
    [("\\boxed{0.3}", "\\frac{1}{4}"), ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}"), ("\\boxed{x+1}", "x-1")],
)
def test_different_answers_are_wrong(reward, answer, truth):
    assert reward.compute_score("s", make(answer), truth) == 0.0


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        # each tag missing costs 0.05
        (make().replace("<think>\n", "<think>"), 0.95),
        (make().replace("\n</think>\n", "</think>\n"), 0.95),
        (make().replace("<answer>\n", "<answer>"), 0.95),
        (make().replace("\n</answer>", "</answer>"), 0.95),
        # a tag present twice earns nothing for that tag
        (make() + "\n</answer>", 0.95),
        # text before <think> / after </answer>: 0.001 a character, at most 0.1 each
        (make(before="abc"), 0.997),
        (make(after="  xyz  "), 0.997),
        (make(before="x" * 500), 0.9),
        (make(before="x" * 500, after="y" * 500), 0.8),
        (make(before="\n"), 1.0),
    ],
)
def test_format_tags_and_stray_text(reward, response, expected):
    assert reward.compute_score("s", response, "1") == expected  # exact, not approximately


@pytest.mark.parametrize(
    "response",
    [
        f"</think>\n<think>\n{STEPS}<answer>\n\\boxed{{1}}\n</answer>",
        f"<think>\n{STEPS}<answer>\n\\boxed{{1}}\n</answer>\n</think>\n",
        f"<think>\n{STEPS}</think>\n</answer>\n<answer>\n\\boxed{{1}}\n",
    ],
    ids=["close-think-first", "answer-before-close-think", "close-answer-first"],
)
def test_tags_out_of_order_give_format_zero(reward, response):
    result = reward.compute_score_dict("s", response, "1")
    assert result["correct"] and result["format"] == 0.0


@pytest.mark.parametrize(
    ("think", "cot"),
    [
        (STEPS, 0.1),
        ("1. Solve the equation carefully.\n2. Substitute the root.\n3. Check the signs now.\n", 0.1),
        ("(1) We calculate the sum.\n(2) Thus the product is known.\n(3) Write it down here.\n", 0.1),
        ("Step 1: Solve the equation.\nStep 2: Write the result.\n", 0.05),
        ("Step 1: Solve the equation.\nStep 2: Write it.\nStep 3: Done with it.\n", 0.05),
        ("Step 1: Look at it.\nStep 2: Write it.\nStep 3: Done with it.\n", 0.0),
        ("Step 2: Solve the equation.\nStep 3: Substitute back.\nStep 4: Therefore done.\n", 0.0),
        ("Step 1: Solve the equation.\nStep 2: Thus x is 1.\nStep 4: Therefore done.\n", 0.05),
        ("Step 1: sum\nStep 2: sum\nStep 3: sum\n", 0.0),
        ("Solve the equation, substitute, therefore done.\n", 0.0),
    ],
    ids=[
        "step",
        "dot",
        "paren",
        "two-steps",
        "one-keyword",
        "no-keyword",
        "not-from-1",
        "gap",
        "short",
        "none",
    ],
)
def test_chain_of_thought(reward, think, cot):
    result = reward.compute_score_dict("s", make(think=think), "1")
    assert result["cot"] == cot
    assert result["score"] == (700 + 200 + round(cot * 1000)) / 1000


def test_totals_are_exact(reward):
    for think, cot in ((STEPS, 100), ("Step 1: Solve it.\nStep 2: Write it.\n", 50), ("", 0)):
        for before in ("", "ab", "x" * 200):
            expected = (700 + 200 - min(100, len(before)) + cot) / 1000
            assert reward.compute_score("s", make(think=think, before=before), "1") == expected


def test_answer_block_wins_over_boxed_values_in_the_reasoning(reward):
    think = STEPS + "So maybe \\boxed{5}.\n"
    assert reward.compute_score("s", make("\\boxed{1}", think=think), "1") == 1.0
    assert reward.compute_score("s", make("\\boxed{1}", think=think), "5") == 0.0


def test_without_answer_block_the_last_boxed_after_the_reasoning_counts(reward):
    response = "<think>\nTry \\boxed{5} first.\n</think>\nThe answer is \\boxed{1}."
    assert reward.compute_score_dict("s", response, "1")["correct"]
    assert reward.compute_score("s", response, "5") == 0.0
    only_in_reasoning = "<think>\nIt is \\boxed{1}.\n</think>\nThe answer is one."
    assert reward.compute_score("s", only_in_reasoning, "1") == 0.0
    untagged = "First guess \\boxed{5}.\nFinally \\boxed{1}."
    assert reward.compute_score("s", untagged, "1") == 0.7


@pytest.mark.parametrize(
    "response",
    [
        make("\\boxed{1} or \\boxed{2}"),
        make("1 or 2"),
        "<think>\nthink\n</think>\n\\boxed{1} or \\boxed{2}",
        "The answer is \\boxed{1} or \\boxed{2}",
    ],
)
def test_several_different_values_are_wrong(reward, response):
    assert reward.compute_score("s", response, "1") == 0.0
    assert reward.compute_score("s", response, "2") == 0.0


def test_the_same_value_boxed_twice_is_one_answer(reward):
    assert reward.compute_score("s", make("\\boxed{1} = \\boxed{1}"), "1") == 1.0


def test_ground_truth_forms(reward):
    assert reward.compute_score("s", make(), 1) == 1.0
    assert reward.compute_score("s", make(), "\\boxed{1}") == 1.0
    assert reward.compute_score("s", make(), ["7", "1"]) == 1.0
    assert reward.compute_score("s", make(), "$1$") == 1.0


def test_dict_keys_are_the_same_for_every_outcome(reward):
    outcomes = [
        reward.compute_score_dict("s", make(), "1"),
        reward.compute_score_dict("s", make("\\boxed{2}"), "1"),
        reward.compute_score_dict("s", None, "1"),
    ]
    assert len({tuple(sorted(o)) for o in outcomes}) == 1


def test_batch_matches_single_calls(reward):
    responses = [make(), make("\\boxed{2}"), make("0.5"), make("\\boxed{(x+1)^2}"), "no answer", None]
    truths = ["1", "1", "\\frac12", "x^2+2x+1", "1", "1"]
    batch = reward.compute_score_batch(
        data_sources=["s"] * len(responses), solution_strs=responses, ground_truths=truths, extra_infos=None
    )
    assert batch == [reward.compute_score_dict("s", r, t) for r, t in zip(responses, truths, strict=True)]
    assert [b["score"] for b in batch] == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]


def test_extra_keyword_arguments_are_accepted(reward):
    assert reward.compute_score("s", make(), "1", extra_info={"split": "train"}, timeout=2, unknown=3) == 1.0


def test_import_defines_things_only(tmp_path):
    code = (
        "import importlib.util, threading, sys\n"
        f"spec = importlib.util.spec_from_file_location('custom_module', {str(REWARD_PATH)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert m._POOL is None and threading.active_count() == 1, 'import started work'\n"
        "assert 'sympy' not in sys.modules and 'math_verify' not in sys.modules\n"
        "print('clean')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "clean", done.stderr


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REWARD_PATH), *args], capture_output=True, text=True, input=stdin, timeout=120
    )


def test_cli_help():
    done = _cli("--help")
    assert done.returncode == 0 and "score" in done.stdout


def test_cli_scores_a_jsonl_file(tmp_path):
    rows = [
        {"response": make(), "ground_truth": "1"},
        {"solution_str": make("\\boxed{3}"), "ground_truth": "1"},
        {"response": make("\\boxed{\\frac{2}{4}}"), "reward_model": {"ground_truth": "0.5"}},
    ]
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _cli("score", str(path), "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]  # JSON Lines to the last line
    assert [line["score"] for line in lines[:3]] == [1.0, 0.0, 1.0]
    assert len(lines) == 4 and lines[3]["summary"]["items"] == 3 and lines[3]["summary"]["correct"] == 2
    plain = _cli("score", str(path))
    assert plain.stdout.splitlines()[-1].startswith("summary: items=3 ") and "correct=2/3" in plain.stdout


@pytest.mark.parametrize(("content", "message"), [(None, "No such file"), ("{not json\n", "not JSON")])
def test_cli_reports_bad_input_in_one_line(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_text(content)
    done = _cli("score", str(path))
    assert done.returncode == 1
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ("score",),
        ("score", "x.jsonl", "--timeout", "0"),
        ("score", "x.jsonl", "--timeout", "nan"),
        ("bogus",),
    ],
)
def test_cli_usage_error_is_one_line_with_status_2(args):
    done = _cli(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: ")


def test_cli_closed_stdin_is_one_line_error():
    done = subprocess.run(
        f"exec {sys.executable!s} {str(REWARD_PATH)!s} score - <&-",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: standard input is closed; pass a file name or pipe the JSONL in"
    ]


def test_cli_reads_stdin_and_rejects_non_utf8(tmp_path):
    done = _cli("score", "-", "--json", stdin=json.dumps({"response": make(), "answer": "1"}) + "\n")
    assert [json.loads(line) for line in done.stdout.splitlines()][0]["score"] == 1.0
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"response": "\xe9"}\n')
    bad = _cli("score", str(path))
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "not UTF-8" in bad.stderr
