"""Answer extraction on hand-written completions (no data needed)."""

from __future__ import annotations

import pytest

from spectr_repro.data.answers import answers_match, extract_number_answer, normalize_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so she makes 9 * 2 = $18 every day.\n#### 18", "18"),
        ("The total is 1,000 + 125 = 1,125.\n#### 1,125", "1125"),
        ("First 3 + 4 = 7, then the answer is \\boxed{42}. Check: 5 apples.", "42"),
        ("\\boxed{12} is wrong, fixed: \\boxed{13}", "13"),
        ("Die Antwort lautet 114,200.", "114200"),
        ("答案是 5600。", "5600"),
        ("The answer is $2,125.00.", "2125"),
        ("It costs 3.50 dollars.", "3.5"),
        ("The temperature fell to -4 degrees.", "-4"),
        ("উত্তর হল ৮।", "8"),  # Bengali digits
        ("No number here.", None),
    ],
)
def test_extract_number_answer(text, expected):
    assert extract_number_answer(text) == expected


def test_final_marker_beats_later_numbers():
    assert extract_number_answer("#### 18\n\nQuestion: 4 more") == "18"


def test_normalize_and_match():
    assert normalize_number("1,000.00") == "1000"
    assert normalize_number("abc") is None
    assert answers_match("18", "18.0")
    assert not answers_match("18", "19")
    assert not answers_match(None, "18")
