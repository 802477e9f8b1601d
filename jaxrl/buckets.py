"""Shape buckets: a size is rounded up to one of a few allowed values, so that a jitted program
compiles a bounded number of times (one per bucket) instead of once per size.

Used by the rollout engine (rows, prompt length, new tokens) and by the trainer (padded sequence
length). Imports nothing from the rest of jaxrl.
"""
from __future__ import annotations

from typing import Optional, Sequence


def pow2_buckets(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two times `lo` below `hi`, then `hi`: ``pow2_buckets(16, 100) == (16, 32, 64, 100)``.

    Args:
      lo: the smallest bucket (>= 1).
      hi: the largest bucket (>= lo); always included, whether or not it is a power of two.
    Raises:
      ValueError: lo < 1 or hi < lo.
    """
    if lo < 1 or hi < lo:
        raise ValueError(f"pow2_buckets needs 1 <= lo <= hi, got lo={lo}, hi={hi}")
    out, b = [], lo
    while b < hi:
        out.append(b)
        b *= 2
    out.append(hi)
    return tuple(out)


def round_up(n: int, buckets: Sequence[int], what: str, fix: Optional[str] = None) -> int:
    """The smallest bucket >= n (buckets in any order).

    Args:
      n: the size to round.
      buckets: the allowed sizes.
      what: the name of the size, for the error (e.g. "prompt length").
      fix: optional advice appended to the error (e.g. "add a larger bucket").
    Raises:
      ValueError: n exceeds the largest bucket; the message names `what`, n and that bucket.
    """
    for b in sorted(buckets):
        if b >= n:
            return int(b)
    msg = f"{what} = {n} exceeds the largest bucket {max(buckets, default=0)}"
    raise ValueError(msg + (f"; {fix}" if fix else ""))
