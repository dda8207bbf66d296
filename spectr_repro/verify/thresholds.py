"""The statistical and numerical thresholds of the exact-law and Monte-Carlo checks, defined once.

EXACT_TV: two exact laws (float64, the rules' uniforms integrated analytically) agree to round-off, ~1e-16;
    a biased rule is off by >= 1e-3 on the toys, so 1e-9 separates the two by six orders of magnitude each way.
BIASED_TV: a rule flagged not lossless must be measurably biased: the smallest bias of any such rule on the toys
    is > 1e-3, ten times this.
ALPHA: a chi-square check of a lossless rule passes at p > 1e-4 (a false alarm once in 10^4 seeds; stated in
    docs/methods.md).
POWER_ALPHA: a negative control must fall far below ALPHA, not just below it.
"""

EXACT_TV = 1e-9
BIASED_TV = 1e-4
ALPHA = 1e-4
POWER_ALPHA = 1e-6

__all__ = ["ALPHA", "BIASED_TV", "EXACT_TV", "POWER_ALPHA"]
