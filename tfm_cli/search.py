"""Decoding searches over a step function (greedy, beam), and the one definition of a sequence score.

Score convention, shared by `translate`, `score -m` and the tests:
  raw score   = sum of log p(y_t | y_<t, x) over the output tokens, EOS included (natural log);
  normalised  = raw / length_penalty(len), len = number of output tokens including EOS.
"""

from __future__ import annotations


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016; the paper's section 6.1).

    `length` counts output tokens including EOS. alpha = 0 gives 1.0 (no normalisation).
    """
    return ((5.0 + length) / 6.0) ** alpha
