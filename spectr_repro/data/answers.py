"""Final-answer extraction for the math datasets (GSM8K, MGSM).

Order of preference in a completion: the last ``\\boxed{...}`` (what instruct models are asked for), then
GSM8K's ``#### <number>`` line, then the last number anywhere (MGSM's "The answer is 18." in any language).
Numbers are normalised: thousands commas and a leading ``$`` dropped, ``5.00`` -> ``5``; Unicode decimal
digits (e.g. Bengali) read as digits.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A number with optional thousands commas ("114,200") or a plain one ("2125", "-3.5").
NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(NUMBER)
_GSM8K_FINAL_RE = re.compile(r"####\s*\$?\s*(" + NUMBER + ")")
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


def normalize_number(text: str) -> str | None:
    """Canonical string of a number (``"1,000.00"`` -> ``"1000"``); None when ``text`` holds none."""
    match = _NUMBER_RE.search(text.replace("$", ""))
    if match is None:
        return None
    try:
        value = Decimal(match.group(0).replace(",", ""))
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_number_answer(text: str) -> str | None:
    """The final numeric answer of a completion, normalised; None when there is none."""
    boxed = _BOXED_RE.findall(text)
    for candidate in reversed(boxed):
        number = normalize_number(candidate)
        if number is not None:
            return number
    final = _GSM8K_FINAL_RE.findall(text)
    if final:
        return normalize_number(final[-1])
    numbers = _NUMBER_RE.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def answers_match(predicted: str | None, reference: str | None) -> bool:
    """Numeric equality of two answers (both normalised); False when either is missing."""
    if predicted is None or reference is None:
        return False
    left, right = normalize_number(predicted), normalize_number(reference)
    return left is not None and left == right
