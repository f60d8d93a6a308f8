"""Numbers with units as people write them: "1,600 tok/s", "5.4M/hour", "90TB", "36h".

Every parser raises `InputError` with the offending text and the units it understands, because a
wrong unit is exactly the mistake a capacity plan has to catch rather than absorb.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from draftsmith.core.errors import InputError

# Decimal magnitudes for token counts ("5.4M" tokens). "B" and "G" both mean 1e9 for counts.
COUNT_SUFFIXES: dict[str, float] = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "m": 1e6,  # lower-case m after a number is read as million for counts, never milli
    "M": 1e6,
    "b": 1e9,
    "B": 1e9,
    "g": 1e9,
    "G": 1e9,
    "t": 1e12,
    "T": 1e12,
}

# Time units a rate can be "per", in seconds, with the spellings accepted for each.
TIME_UNIT_SECONDS: dict[str, float] = {
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 7 * 86400.0,
}
_TIME_UNIT_SPELLINGS: dict[str, str] = {}
for _name, _spellings in {
    "second": ["s", "sec", "secs", "second", "seconds"],
    "minute": ["min", "mins", "minute", "minutes"],
    "hour": ["h", "hr", "hrs", "hour", "hours"],
    "day": ["d", "day", "days"],
    "week": ["w", "wk", "week", "weeks"],
}.items():
    for _spelling in _spellings:
        _TIME_UNIT_SPELLINGS[_spelling] = _name

# Words that may stand for "tokens" in a rate ("tok/s", "tokens per hour", "t/s").
_TOKEN_WORDS = {"", "t", "tok", "toks", "token", "tokens"}

_NUMBER = r"[+-]?(?:\d[\d,_]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_COUNT_RE = re.compile(rf"^\s*(?P<number>{_NUMBER})\s*(?P<suffix>[A-Za-z]?)\s*$")
_RATE_RE = re.compile(
    rf"^\s*(?P<number>{_NUMBER})\s*(?P<suffix>[kKmMbBgGtT](?![a-zA-Z]))?\s*"
    rf"(?P<tokens>[A-Za-z]*)\s*(?:/|\bper\b)\s*(?P<unit>[A-Za-z]+)\s*$"
)
_PER_GPU_RE = re.compile(r"\s*(?:/|\bper\b|\beach\b)\s*(?:gpu|device|server|replica)s?\s*$", re.IGNORECASE)
_MAGNITUDE_WORDS = {"thousand": "k", "million": "M", "billion": "B", "trillion": "T"}
_MAGNITUDE_WORD_RE = re.compile(r"\s*\b(thousand|million|billion|trillion)\b", re.IGNORECASE)
_TPS_RE = re.compile(rf"^\s*(?P<number>{_NUMBER})\s*(?P<suffix>[kKmMbBgGtT])?\s*tps\s*$", re.IGNORECASE)


# Commas are accepted only as thousands separators in groups of three ("1,600", "12,345,678"):
# anything else ("1,5k") is a decimal comma to one reader and a separator to another, 1000x apart.
_GROUPED_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?(?:[eE][+-]?\d+)?$")


def _parse_number(text: str, original: str, what: str) -> float:
    if "," in text and not _GROUPED_RE.match(text):
        raise InputError(
            f"{what} {original!r}: {text!r} is ambiguous: a comma may be a decimal point or a thousands "
            f"separator; write {text.replace(',', '.')!r} or {text.replace(',', '')!r}"
        )
    cleaned = text.replace(",", "").replace("_", "")
    try:
        value = float(cleaned)
    except ValueError:
        raise InputError(f"{what} {original!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"{what} {original!r}: not a finite number")
    return value


def parse_count(text: str | int | float, what: str = "count") -> float:
    """A token or sample count: 914000, "914,000", "914k", "2.5k", "5.4M", "1.2B".

    Negative counts are refused; fractional results are returned as float (callers round).
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r}: expected a number")
    if isinstance(text, (int, float)):
        value = float(text)
        original = str(text)
    else:
        original = text
        match = _COUNT_RE.match(text)
        if not match:
            raise InputError(
                f"{what} {text!r}: expected a number with an optional k/M/B suffix (e.g. 914,000 or 2.5k)"
            )
        suffix = match.group("suffix")
        if suffix not in COUNT_SUFFIXES:
            raise InputError(f"{what} {text!r}: unknown suffix {suffix!r} (use k, M, B or T)")
        value = _parse_number(match.group("number"), original, what) * COUNT_SUFFIXES[suffix]
    if not math.isfinite(value):
        raise InputError(f"{what} {original!r}: not a finite number")
    if value < 0:
        raise InputError(f"{what} {original!r}: must not be negative")
    return value


@dataclass(frozen=True)
class Rate:
    """A token rate as written, and what it means in tokens per second."""

    text: str
    amount: float  # tokens per `unit`, magnitude suffix already applied
    unit: str  # one of TIME_UNIT_SECONDS
    tokens_per_s: float
    per_gpu: bool = False  # written with a "/GPU" or "per GPU" qualifier

    def per(self, unit: str) -> float:
        """The same rate expressed per `unit` (e.g. per "day")."""
        return self.tokens_per_s * TIME_UNIT_SECONDS[unit]


def unit_label(unit: str) -> str:
    return {"second": "s", "minute": "min", "hour": "hour", "day": "day", "week": "week"}[unit]


def parse_rate(text: str | int | float, what: str = "rate", bare_unit: str | None = "second") -> Rate:
    """A token rate: "1,600 tok/s", "1.5k tok/s", "400/s", "5.4M/hour", "129.6M/day", "90 tps".

    A bare number ("1600", "1.5k") is read as per `bare_unit`; pass `bare_unit=None` to require a
    unit, which is what claimed rates do: a rate without its time unit is the slip we are checking
    for. A bare count of millions or more ("5.4M") always needs its unit.
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r}: expected a rate such as '1,600 tok/s'")
    original = str(text)
    written = original
    per_gpu = False
    if isinstance(text, str):
        qualifier = _PER_GPU_RE.search(written)
        if qualifier:
            per_gpu = True
            written = written[: qualifier.start()]
        written = _MAGNITUDE_WORD_RE.sub(lambda m: _MAGNITUDE_WORDS[m.group(1).lower()], written)
    bare = _COUNT_RE.match(written) if isinstance(text, str) else None
    if isinstance(text, (int, float)) or bare:
        # "5.4M" alone is millions per hour or per day, never per second: insist on the unit.
        if bare_unit is None or (bare and bare.group("suffix") in set("mMbBgGtT")):
            raise InputError(
                f"{what} {original!r}: needs a time unit, e.g. '{original} tok/s', '{original}/hour' or '{original}/day'"
            )
        amount = parse_count(text if isinstance(text, (int, float)) else written, what)
        return Rate(original, amount, bare_unit, amount / TIME_UNIT_SECONDS[bare_unit], per_gpu)
    tps = _TPS_RE.match(written)
    if tps:
        amount = _parse_number(tps.group("number"), original, what) * COUNT_SUFFIXES[tps.group("suffix") or ""]
        unit = "second"
    else:
        match = _RATE_RE.match(written)
        if not match:
            raise InputError(
                f"{what} {original!r}: not a rate; write it like '1,600 tok/s', '5.4M/hour' or '129.6M/day'"
            )
        tokens_word = match.group("tokens")
        if tokens_word.lower() not in _TOKEN_WORDS:
            raise InputError(
                f"{what} {original!r}: unknown unit {tokens_word!r} (only token rates: tok/s, tokens/hour, M/day)"
            )
        unit_text = match.group("unit")
        unit = _TIME_UNIT_SPELLINGS.get(unit_text) or _TIME_UNIT_SPELLINGS.get(unit_text.lower())
        if unit is None or (unit_text == "M"):
            raise InputError(
                f"{what} {original!r}: unknown time unit {unit_text!r} (use s, min, hour, day or week)"
            )
        amount = _parse_number(match.group("number"), original, what) * COUNT_SUFFIXES[match.group("suffix") or ""]
    if amount < 0:
        raise InputError(f"{what} {original!r}: must not be negative")
    return Rate(original, amount, unit, amount / TIME_UNIT_SECONDS[unit], per_gpu)


_SIZE_RE = re.compile(rf"^\s*(?P<number>{_NUMBER})\s*(?P<unit>[A-Za-z]*)\s*$")
_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "p": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "pi": 2**50,
}


def parse_size(text: str | int | float, what: str = "size") -> int:
    """A byte size: "90TB" (decimal, 90e12), "2 TiB" (binary, 2*2**40), "500GB", 1e12 (bytes)."""
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r}: expected a size such as '90TB' or '2 TiB'")
    if isinstance(text, (int, float)):
        value = float(text)
        unit_bytes = 1
        original = str(text)
    else:
        original = text
        match = _SIZE_RE.match(text)
        if not match:
            raise InputError(f"{what} {text!r}: expected a size such as '90TB', '2 TiB' or '500GB'")
        unit = match.group("unit")
        if unit.lower() not in _SIZE_UNITS:
            raise InputError(
                f"{what} {text!r}: unknown size unit {unit!r} (use B, KB, MB, GB, TB, PB or KiB..PiB)"
            )
        value = _parse_number(match.group("number"), original, what)
        unit_bytes = _SIZE_UNITS[unit.lower()]
    if value < 0:
        raise InputError(f"{what} {original!r}: must not be negative")
    return int(round(value * unit_bytes))


_DURATION_PART_RE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[A-Za-z]+)")


def parse_duration(text: str | int | float, what: str = "duration") -> float:
    """A duration in seconds: "7d", "36h", "1.5 days", "90min", "2w", "1d12h".

    A bare number is refused: "7" could be days or hours, and guessing is the failure mode.
    """
    original = str(text)
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        raise InputError(f"{what} {original!r}: needs a unit, e.g. '{original}d' or '{original}h'")
    stripped = original.strip()
    if stripped.startswith("-"):
        raise InputError(f"{what} {original!r}: must not be negative")
    position = 0
    total = 0.0
    found = False
    for match in _DURATION_PART_RE.finditer(stripped):
        if stripped[position : match.start()].strip():
            break
        unit_text = match.group("unit")
        unit = _TIME_UNIT_SPELLINGS.get(unit_text.lower())
        if unit is None or unit_text == "M":
            raise InputError(f"{what} {original!r}: unknown time unit {unit_text!r} (use s, min, h, d or w)")
        total += float(match.group("number")) * TIME_UNIT_SECONDS[unit]
        position = match.end()
        found = True
    if not found or stripped[position:].strip():
        if _COUNT_RE.match(stripped) and not re.search(r"[A-Za-z]", stripped):
            raise InputError(f"{what} {original!r}: needs a unit, e.g. '{stripped}d' or '{stripped}h'")
        raise InputError(f"{what} {original!r}: expected a duration such as '7d', '36h' or '1d12h'")
    if total <= 0:
        raise InputError(f"{what} {original!r}: must be greater than zero")
    return total


def format_count(value: float, digits: int = 4) -> str:
    """Short human count: 5400000 -> '5.4M', 1500 -> '1.5k', 914000 -> '914k'."""
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            scaled = value / threshold
            return f"{_significant(scaled, digits)}{suffix}"
    return _significant(value, digits)


def _significant(value: float, digits: int) -> str:
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_tokens_per_s(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f} tok/s"
    return f"{_significant(value, 3)} tok/s"


def format_bytes(value: float) -> str:
    """Decimal units (TB = 1e12), as disks are sold, with the binary TiB figure for large sizes."""
    for threshold, suffix in ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if value >= threshold:
            text = f"{_significant(value / threshold, 3)} {suffix}"
            if threshold >= 1e12:
                text += f" ({_significant(value / 2**40, 3)} TiB)"
            return text
    return f"{int(value)} B"


def format_duration(seconds: float | None, *, compact: bool = False) -> str:
    """The one duration formatter. '16.5 days', '9.3 hours', '42 min', '12 s' (the unit a person
    would pick, for plans); ``compact`` is the fixed-width ETA of a progress line: '2d03h', '1h05m', '4m09s'."""
    if seconds is None or not math.isfinite(seconds):
        return "--" if compact else "never"
    if compact:
        days, rest = divmod(int(seconds), 86400)
        hours, rest = divmod(rest, 3600)
        minutes, secs = divmod(rest, 60)
        if days:
            return f"{days}d{hours:02d}h"
        return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
