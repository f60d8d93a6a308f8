import pytest

from draftsmith.core.errors import InputError
from draftsmith.core.units import (
    format_bytes,
    format_count,
    format_duration,
    parse_count,
    parse_duration,
    parse_rate,
    parse_size,
)


@pytest.mark.parametrize(
    "text, tokens_per_s",
    [
        ("5.4M/hour", 1500.0),
        ("129.6M/day", 1500.0),
        ("1.5k tok/s", 1500.0),
        ("1,600 tok/s", 1600.0),
        ("400/s", 400.0),
        ("90k/min", 1500.0),
        ("5.4M tokens per hour", 1500.0),
        ("1500 tokens/sec", 1500.0),
        ("2.5k t/s", 2500.0),
        ("350 tps", 350.0),
        ("907.2M/week", 1500.0),
        ("1600", 1600.0),  # a bare number on a tok/s flag is tok/s
    ],
)
def test_rates_parse_to_tokens_per_second(text, tokens_per_s):
    assert parse_rate(text).tokens_per_s == pytest.approx(tokens_per_s)


def test_rates_convert_both_ways():
    hourly = parse_rate("5.4M/hour")
    assert hourly.unit == "hour" and hourly.amount == 5_400_000
    assert hourly.per("day") == pytest.approx(129.6e6)
    assert hourly.per("second") == pytest.approx(1500)
    per_second = parse_rate("1,500 tok/s")
    assert per_second.per("hour") == pytest.approx(5.4e6)
    assert format_count(per_second.per("hour")) == "5.4M"
    assert format_count(per_second.per("day")) == "129.6M"
    assert parse_rate(f"{format_count(per_second.per('day'))}/day").tokens_per_s == pytest.approx(1500)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("5.4M/fortnight", "unknown time unit 'fortnight'"),
        ("5.4M/m", "unknown time unit 'm'"),  # minute or month? refuse to guess
        ("5.4X/day", "unknown unit 'X'"),
        ("5 GB/s", "unknown unit 'GB'"),
        ("-3 tok/s", "must not be negative"),
        ("fast", "not a rate"),
    ],
)
def test_bad_rates_name_the_problem(text, fragment):
    with pytest.raises(InputError, match="rate") as caught:
        parse_rate(text)
    assert fragment in str(caught.value)
    assert text in str(caught.value)


def test_claimed_rate_needs_a_time_unit():
    with pytest.raises(InputError, match="needs a time unit"):
        parse_rate("5.4M", bare_unit=None)


@pytest.mark.parametrize(
    "text, count",
    [("914000", 914_000), ("914,000", 914_000), ("914k", 914_000), ("2.5k", 2500), ("1.2B", 1.2e9), (2500, 2500)],
)
def test_counts(text, count):
    assert parse_count(text) == pytest.approx(count)


def test_counts_refuse_negative_and_unknown_suffix():
    with pytest.raises(InputError, match="negative"):
        parse_count("-5")
    with pytest.raises(InputError, match="unknown suffix 'x'"):
        parse_count("5x")


@pytest.mark.parametrize(
    "text, size",
    [
        ("90TB", 90 * 10**12),
        ("2 TiB", 2 * 2**40),
        ("500GB", 500 * 10**9),
        ("1.5 PB", 1.5 * 10**15),
        ("512 GiB", 512 * 2**30),
        (10**12, 10**12),
    ],
)
def test_sizes(text, size):
    assert parse_size(text) == size


def test_bad_sizes():
    with pytest.raises(InputError, match="unknown size unit 'XB'"):
        parse_size("90XB")
    with pytest.raises(InputError, match="negative"):
        parse_size("-1TB")


@pytest.mark.parametrize(
    "text, seconds",
    [("7d", 7 * 86400), ("36h", 36 * 3600), ("1.5 days", 1.5 * 86400), ("90min", 5400), ("2w", 14 * 86400),
     ("1d12h", 36 * 3600), ("3600s", 3600)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text, fragment",
    [("7", "needs a unit"), ("7x", "unknown time unit 'x'"), ("-2d", "negative"), ("soon", "expected a duration"),
     ("0h", "greater than zero")],
)
def test_bad_durations(text, fragment):
    with pytest.raises(InputError, match=fragment):
        parse_duration(text)


def test_formatting():
    assert format_count(914_000) == "914k"
    assert format_count(2_285_000_000) == "2.285B"
    assert format_bytes(93_593_600_000_000) == "93.6 TB (85.1 TiB)"
    assert format_duration(1_428_125) == "16.5 days"
    assert format_duration(36 * 3600) == "36.0 hours"


def test_per_gpu_qualifier_and_magnitude_words():
    rate = parse_rate("400 tok/s/GPU")
    assert rate.per_gpu and rate.tokens_per_s == 400
    assert parse_rate("400 tokens/s per GPU").per_gpu
    assert not parse_rate("400 tok/s").per_gpu
    assert parse_rate("5.4 million tokens per hour").tokens_per_s == pytest.approx(1500)


def test_a_bare_count_of_millions_needs_its_time_unit():
    with pytest.raises(InputError, match="needs a time unit"):
        parse_rate("5.4M")
    assert parse_rate("1.5k").tokens_per_s == 1500


@pytest.mark.parametrize("text", ["1,5k tok/s", "1,5 tok/s", "1,5000/s", "12,34 tps", "1,5"])
def test_a_comma_that_is_not_a_thousands_separator_is_refused(text):
    with pytest.raises(InputError, match="ambiguous: a comma may be a decimal point or a thousands separator"):
        parse_rate(text)


def test_thousands_separators_still_parse():
    assert parse_rate("1,500 tok/s").tokens_per_s == 1500
    assert parse_rate("1,600").tokens_per_s == 1600
    assert parse_count("12,345,678") == 12_345_678
    assert parse_size("1,000 GB") == 10**12
    with pytest.raises(InputError, match="ambiguous"):
        parse_count("2,5M")
