"""Gate thresholds: the limits that turn an audit into PASS or FAIL.

Every limit is a maximum share of all samples (0.05 = 5%), except the counts `dominant_min_count`,
`empty_thinking_min_count` and `min_samples`. A limit of `None` switches that gate off. Defaults are set to catch disasters
(a stock reply in most rows, a template bug masking headers) without failing ordinary, varied data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from draftsmith.core.errors import InputError


@dataclass
class Thresholds:
    #: unreadable rows: bad JSON, no messages, null/invalid token columns
    bad_samples: float | None = 0.01
    #: one exact loss-mask sum (trainable tokens per sample) shared by this many samples
    dominant_mask_sum: float | None = 0.30
    #: one identical masked token span (the same completion) shared by this many samples
    dominant_span: float | None = 0.10
    #: a mask sum or span is dominant only when at least this many samples share it (a count,
    #: on top of the two shares above): in a small set one sample is 20% of five, and two or three
    #: varied answers of the same length are common; five copies of one completion still fail
    dominant_min_count: int | None = 5
    #: responses with no trainable content (empty, whitespace, only template tokens)
    empty_response: float | None = 0.01
    #: responses whose trained thinking block is present but empty
    empty_thinking: float | None = 0.25
    #: empty thinking fails only when at least this many samples have it (a count, on top of the
    #: share): one honest empty think in three rows is 33%, not a broken generation
    empty_thinking_min_count: int | None = 5
    #: trainable span not ending with the end-of-turn token / generation that did not stop
    missing_end_of_turn: float | None = 0.01
    #: completions that stopped at max_tokens (finish_reason "length")
    truncated: float | None = 0.05
    #: samples longer than the context limit
    over_context: float | None = 0.01
    #: loss mask covering role headers or other template scaffolding
    scaffolding_masked: float | None = 0.0
    #: loss mask covering prompt tokens
    prompt_masked: float | None = 0.0
    #: loss_mask and input_ids of different lengths
    length_mismatch: float | None = 0.0
    #: completions identical to an earlier sample's: above half, most of the generation budget
    #: was spent producing copies (one stock reply is caught earlier by dominant_span)
    duplicate_completions: float | None = 0.50
    #: prompt and completion identical to an earlier sample's; the same prompt with another
    #: completion is a deliberate sample (several answers per prompt), not counted
    duplicate_prompts: float | None = 0.50
    #: samples whose id an earlier sample already has: `train` refuses such a set, so any fails
    repeated_ids: float | None = 0.0
    #: fewer readable samples than this fails (an empty dataset never passes)
    min_samples: int | None = 1

    @classmethod
    def names(cls) -> list[str]:
        return [field.name for field in fields(cls)]

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)

    def updated(self, overrides: dict[str, float | int | None]) -> "Thresholds":
        values = self.to_dict()
        for name, value in overrides.items():
            if name not in values:
                raise InputError(
                    f"unknown threshold {name!r}; known thresholds: {', '.join(self.names())}"
                )
            values[name] = value
        return Thresholds(**values)

    @classmethod
    def from_assignments(cls, assignments: list[str] | None, base: "Thresholds | None" = None) -> "Thresholds":
        """Parse `name=value` strings (`0.05`, `5%`, `none`/`off` to disable); one string may hold
        several, comma-separated, as `--help` lists the gates (`a=none,b=0.1`)."""
        overrides: dict[str, float | int | None] = {}
        # No value holds a comma (shares, counts, none), so a comma always separates assignments.
        for assignment in (part for item in assignments or [] for part in item.split(",") if part.strip()):
            name, sep, raw = assignment.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or not name:
                raise InputError(f"--threshold {assignment!r}: expected name=value, e.g. dominant_span=0.05")
            overrides[name] = parse_threshold_value(name, raw.strip())
        return (base or cls()).updated(overrides)


#: thresholds that are sample counts, not shares
COUNT_THRESHOLDS = ("dominant_min_count", "empty_thinking_min_count", "min_samples")


def parse_threshold_value(name: str, raw: str) -> float | int | None:
    if raw.lower() in {"none", "off", "disable", "disabled"}:
        return None
    try:
        if name in COUNT_THRESHOLDS:
            value: float | int = int(raw)
            if value < 0:
                raise ValueError
            return value
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise InputError(
            f"threshold {name}={raw!r}: expected a share such as 0.05 or 5% (or 'none')"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise InputError(f"threshold {name}={raw!r}: a share must lie between 0 and 1 (or 0% and 100%)")
    return value


def coerce_thresholds(thresholds: "Thresholds | dict | None") -> Thresholds:
    if thresholds is None:
        return Thresholds()
    if isinstance(thresholds, Thresholds):
        return thresholds
    if isinstance(thresholds, dict):
        return Thresholds().updated(dict(thresholds))
    raise InputError(f"thresholds must be a Thresholds or a dict, not {type(thresholds).__name__}")
