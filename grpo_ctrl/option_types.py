"""Command-line values checked where they are parsed: the one home for it.

Each function here is an argparse ``type=``: it turns the text into a value
or raises ``ArgumentTypeError`` with what was wrong and what is allowed, so a
bad value ends in one line and exit status 2 before the command does any
work. ``in_range`` and ``describe_range`` are the same check for values that come from a file
(``grpo_ctrl.grpo_config.check_config``).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

# the largest seed any of our generators takes whole (torch: int64)
MAX_SEED = 2**63 - 1
# seconds: beyond this (four months) a duration is a typo, not a plan
MAX_SECONDS = 1e7
# episodes scored in one batch: a million fit in a few hundred MB
MAX_EPISODES = 10**6


def in_range(value, low=None, high=None, above=None) -> bool:
    """Whether the number ``value`` is finite and lies in ``[low, high]``
    (``above``: a strict lower bound instead of ``low``)."""
    return ((isinstance(value, int) or math.isfinite(value)) and (above is None or value > above)
            and (low is None or value >= low) and (high is None or value <= high))


def describe_range(kind=float, low=None, high=None, above=None) -> str:
    """``in_range``'s condition in words: 'an integer from 1 to 4096'."""
    what = "an integer" if kind is int else "a finite number"
    parts = [f"{sign} {bound if isinstance(bound, int) else f'{bound:g}'}"
             for sign, bound in ((">", above), (">=", low), ("<=", high)) if bound is not None]
    return f"{what} {' and '.join(parts)}" if parts else what


def number(kind=float, low=None, high=None, above=None, unit: str = ""):
    """An argparse type: an int or a finite float in ``[low, high]``
    (``above``: strictly above instead of ``low``)."""
    wanted = describe_range(kind, low, high, above) + unit

    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            value = None
        if value is None or not in_range(value, low, high, above):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def seconds(zero_means: str | None = None):
    """Seconds, finite and at most ``MAX_SECONDS``; zero allowed when it
    means something (``zero_means``), else strictly positive."""
    if zero_means:
        return number(float, low=0.0, high=MAX_SECONDS, unit=f" (seconds; 0: {zero_means})")
    return number(float, above=0.0, high=MAX_SECONDS, unit=" (seconds)")


positive_seconds = seconds()
probability = number(float, low=0.0, high=1.0, unit=" (a probability)")
seed = number(int, low=0, high=MAX_SEED, unit=" (a seed)")


def positive_int(high: int):
    return number(int, low=1, high=high)


def existing_file(text: str) -> str:
    """A path to a file that exists."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} {'is a folder' if path.is_dir() else 'does not exist'}; give a file")
    return text
