"""A running quality guard: stop a generation run that is producing junk, within minutes.

Over a rolling window of the most recent rows (after a minimum count), it tracks the share of
empty answers, empty reasoning (only when thinking is expected), identical "boilerplate" answers
(the window's most common answer) and ``finish_reason == "length"``. Crossing any threshold trips
the guard; the pipeline then stops dispatching and exits non-zero, keeping what was written.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass

from draftsmith.generate.config import GuardConfig

_SPACES = re.compile(r"\s+")


@dataclass
class GuardTrip:
    check: str
    share: float
    threshold: float
    window: int
    example: str | None = None

    def message(self) -> str:
        what = {
            "empty_answer": "answers were empty",
            "empty_reasoning": "completions had no reasoning (is thinking enabled and the reasoning parser on?)",
            "boilerplate": "answers were the same text",
            "length": "completions hit max_tokens (finish_reason 'length'; raise --max-tokens?)",
        }[self.check]
        text = f"quality guard: {self.share:.0%} of the last {self.window} {what} (limit {self.threshold:.0%})"
        if self.example is not None:
            text += f": {self.example[:80]!r}"
        return text


def normalize_answer(text: str) -> str:
    return _SPACES.sub(" ", text.strip().lower())


class QualityGuard:
    def __init__(self, config: GuardConfig | None = None):
        self.config = config or GuardConfig()
        size = self.config.window
        self._rows: deque[tuple[bool, bool, str, bool]] = deque(maxlen=size)
        self.answers: Counter[str] = Counter()
        self.empty_answer = self.empty_reasoning = self.length = 0
        self.seen = 0
        self.length_total = 0  # every row cut off at max_tokens, not only the window's
        self.length_warned = False
        self.trip: GuardTrip | None = None
        self._check_every = max(1, min(10, size // 20))

    def observe(self, answer: str, reasoning: str, finish_reason: str | None) -> GuardTrip | None:
        """Record one completed row; returns the trip (once) when a threshold is crossed."""
        entry = (not answer.strip(), not reasoning.strip(), normalize_answer(answer), finish_reason == "length")
        if len(self._rows) == self._rows.maxlen:
            old = self._rows[0]
            self.empty_answer -= old[0]
            self.empty_reasoning -= old[1]
            self.length -= old[3]
            self.answers[old[2]] -= 1
            if self.answers[old[2]] <= 0:
                del self.answers[old[2]]
        self._rows.append(entry)
        self.empty_answer += entry[0]
        self.empty_reasoning += entry[1]
        self.length += entry[3]
        self.answers[entry[2]] += 1
        self.seen += 1
        self.length_total += entry[3]
        # Checking costs O(window) (the most common answer); every few rows is soon enough.
        due = self.seen == self.config.min_samples or self.seen % self._check_every == 0
        if self.trip is None and self.config.enabled and self.seen >= self.config.min_samples and due:
            self.trip = self._check()
            return self.trip
        return None

    def length_warning(self, max_tokens: int) -> str | None:
        """Once, when the share of answers cut off at max_tokens passes `warn_length_finish` (after
        `min_samples` rows, or the whole window when smaller): the run goes on, but those rows are
        lost or truncated downstream, so it is said while there is time to raise the cap."""
        seen_enough = self.seen >= min(self.config.min_samples, self.config.window)
        share = self.length / max(1, len(self._rows))
        if self.length_warned or not seen_enough or share <= self.config.warn_length_finish:
            return None
        self.length_warned = True
        return (f"warning: {share:.0%} of the last {len(self._rows)} answers hit --max-tokens {max_tokens} "
                f"(finish_reason 'length'); tokenize drops or truncates them: raise --max-tokens "
                f"(`draftsmith plan --output-lengths` suggests one from measured lengths)")

    def shares(self) -> dict[str, float]:
        count = max(1, len(self._rows))
        common = self.answers.most_common(1)
        boiler = common[0][1] if common and common[0][1] > 1 and common[0][0] else 0
        return {
            "empty_answer": self.empty_answer / count,
            "empty_reasoning": self.empty_reasoning / count,
            "boilerplate": boiler / count,
            "length": self.length / count,
        }

    def _check(self) -> GuardTrip | None:
        config = self.config
        shares = self.shares()
        count = len(self._rows)
        limits = {
            "empty_answer": config.max_empty_answer,
            "empty_reasoning": config.max_empty_reasoning if config.expect_reasoning else 1.0,
            "boilerplate": config.max_boilerplate,
            "length": config.max_length_finish,
        }
        for check, limit in limits.items():
            if limit < 1.0 and shares[check] > limit:
                example = self.answers.most_common(1)[0][0] if check == "boilerplate" else None
                return GuardTrip(check, shares[check], limit, count, example)
        return None
