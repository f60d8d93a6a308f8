import pytest

from draftsmith.core.errors import InputError
from draftsmith.plan.rates import RateMismatchError, RateSource, choose_rate, compare
from draftsmith.core.units import parse_rate


def source(name, text, scale=1.0, origin=None):
    return RateSource.from_rate(name, origin or f"--{name}", parse_rate(text), scale)


def test_per_day_written_for_per_hour_is_found():
    check = compare(source("throughput", "1,500 tok/s"), source("claimed", "5.4M/day"))
    assert not check.agrees
    assert check.ratio == pytest.approx(62.5 / 1500)
    assert check.matching_reading is not None
    assert check.matching_reading.text == "5.4M/hour"
    assert check.reading_of == "claimed"
    assert "5.4M/hour matches 1,500 tok/s" in check.message


def test_agreeing_rates_in_different_units():
    assert compare(source("throughput", "1,500 tok/s"), source("claimed", "129.6M/day")).agrees
    assert compare(source("throughput", "1.5k tok/s"), source("claimed", "5.4M/hour")).agrees
    # 1,600 vs 5.4M/hour (1,500) is within the default 10% tolerance but not a 5% one.
    assert compare(source("throughput", "1,600 tok/s"), source("claimed", "5.4M/hour")).agrees
    assert not compare(source("throughput", "1,600 tok/s"), source("claimed", "5.4M/hour"), tolerance=0.05).agrees


def test_magnitude_slip_is_found_when_no_time_unit_fits():
    check = compare(source("throughput", "1,500 tok/s"), source("claimed", "5.4k/hour"))
    assert not check.agrees
    assert check.matching_reading.text == "5.4M/hour"


def test_unreconcilable_rates_say_so():
    check = compare(source("throughput", "1,500 tok/s"), source("claimed", "3,100 tok/s"))
    assert not check.agrees and check.matching_reading is None
    assert "no change of time unit" in check.message


def test_refuses_to_plan_on_a_disagreement_without_a_choice():
    sources = [source("throughput", "1,500 tok/s"), source("claimed", "5.4M/day")]
    with pytest.raises(RateMismatchError) as caught:
        choose_rate(sources, None)
    message = str(caught.value)
    assert "refusing to plan" in message and "5.4M/hour matches 1,500 tok/s" in message
    assert "--use-rate throughput" in message and "--use-rate claimed" in message
    assert "\n" not in message
    assert isinstance(caught.value, InputError)


def test_explicit_choice_plans_on_the_chosen_rate():
    sources = [source("throughput", "1,500 tok/s"), source("claimed", "5.4M/day")]
    chosen, checks = choose_rate(sources, "claimed")
    assert chosen.tokens_per_s == pytest.approx(62.5)
    assert [c.agrees for c in checks] == [False]
    chosen, _ = choose_rate(sources, "throughput")
    assert chosen.tokens_per_s == 1500
    with pytest.raises(InputError, match="no such rate"):
        choose_rate(sources, "bench")


def test_per_gpu_rate_is_rescaled_and_reread_per_gpu():
    # "400 per GPU" typed as per hour on 4 GPUs: re-reading it per second reconciles with 1,600 tok/s.
    per_gpu = source("per-gpu", "400/hour", scale=4)
    check = compare(source("throughput", "1,600 tok/s"), per_gpu)
    assert not check.agrees
    assert check.matching_reading.text == "400/s"
    assert check.matching_reading.tokens_per_s == pytest.approx(1600)


def test_no_rate_at_all_is_an_input_error():
    with pytest.raises(InputError, match="no throughput given"):
        choose_rate([], None)
