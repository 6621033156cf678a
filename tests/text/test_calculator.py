"""The tutor's calculator: exact answers, named refusals, and a bounded cost whatever the expression."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from typewriter.text.calculator import MAX_BITS, MAX_DEPTH, MAX_LENGTH, CalculatorError, evaluate


@pytest.mark.parametrize("expression, value", [
    ("12 * 7", 84),
    ("(48 - 12) / 4", 9),
    ("2 + 3 * 4", 14),
    ("2 * (3 + 4)", 14),
    ("10 - 4 - 3", 3),  # left to right
    ("48 / 4 / 2", 6),
    ("2^3^2", 512),  # right to left
    ("2**10", 1024),
    ("-2^2", -4),  # the power binds tighter than the sign
    ("(-2)^2", 4),
    ("2^-2", Fraction(1, 4)),
    ("--3", 3),
    ("0.1 + 0.2", Fraction(3, 10)),  # exact, not binary floating point
    ("1/3 + 1/6", Fraction(1, 2)),
    (".5 * 4", 2),
    ("15% * 80", 12),
    ("(20 + 30)%", Fraction(1, 2)),
    ("1,250 * 4", 5000),
    ("$12.50 * 3", Fraction(75, 2)),
    ("1.5e3 / 3", 500),
    ("sqrt(144)", 12),
    ("sqrt(9/4)", Fraction(3, 2)),
    ("√81", 9),
    ("9^0.5", 3),
    ("4^1.5", 8),
    ("3 × 4 ÷ 6", 2),
    ("−5 + 2", -3),
    ("12 * 7 =", 84),
    ("0^0", 1),
])
def test_an_expression_has_its_exact_value(expression, value):
    result = evaluate(expression)
    assert result.value == value and result.exact


@pytest.mark.parametrize("expression, integer, fraction, decimal, text", [
    ("12*7", "84", "84/1", "84", "84"),
    ("5/2", None, "5/2", "2.5", "2.5"),
    ("1/1024", None, "1/1024", "0.0009765625", "0.0009765625"),
    ("7/3", None, "7/3", "2.33333333333", "7/3 ≈ 2.33333333333"),
    ("-7/3", None, "-7/3", "-2.33333333333", "-7/3 ≈ -2.33333333333"),
    ("2/3 * 10^30", None, "2000000000000000000000000000000/3", "6.66666666667e+29",
     "2000000000000000000000000000000/3 ≈ 6.66666666667e+29"),
])
def test_a_result_reads_as_an_integer_an_exact_fraction_and_a_decimal(expression, integer, fraction, decimal, text):
    result = evaluate(expression)
    assert (result.integer, result.fraction, result.decimal, result.text) == (integer, fraction, decimal, text)


def test_a_square_root_that_is_no_fraction_is_rounded_and_says_so():
    result = evaluate("sqrt(2)")
    assert not result.exact and result.integer is None
    assert result.text == "≈ 1.41421356237"
    assert not evaluate("sqrt(2) * sqrt(2)").exact  # rounded once, rounded for good


@pytest.mark.parametrize("expression, code", [
    ("", "not_an_expression"),
    ("   ", "not_an_expression"),
    ("12 *", "not_an_expression"),
    ("(1 + 2", "not_an_expression"),
    ("1 + 2)", "not_an_expression"),
    ("2(3 + 4)", "not_an_expression"),  # no implicit product: the model must say what it means
    ("1,2345", "not_an_expression"),
    ("1.2.3", "not_an_expression"),
    ("x + 1", "not_an_expression"),
    ("__import__('os').system('id')", "not_an_expression"),
    ("print(1)", "not_an_expression"),
    ("0x10", "not_an_expression"),
    ("1_000", "not_an_expression"),
    ("nan", "not_an_expression"),
    ("inf", "not_an_expression"),
    ("1 / 0", "division_by_zero"),
    ("5 / (2 - 2)", "division_by_zero"),
    ("0^-1", "division_by_zero"),
    ("sqrt(-4)", "not_real"),
    ("2^(1/3)", "not_supported"),
    ("2^sqrt(2)", "not_supported"),
    ("9^9^9", "too_large"),
    ("10^10^10^10", "too_large"),
    ("2^1024", "too_large"),
    ("(10^300) * (10^300)", "too_large"),
    ("1e999999999", "too_large"),
    ("1e-999999999", "too_large"),
    ("1" + "%" * 190, "too_large"),
    ("9" * 400, "too_long"),
    ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "too_long"),
    ("-" * (MAX_DEPTH + 1) + "1", "too_long"),
    ("sqrt " * (MAX_DEPTH + 1) + "4", "too_long"),
    ("2^" * 60 + "2", "too_long"),
    ("1 + \udfff", "not_an_expression"),
])
def test_a_refusal_is_named_and_says_what_to_change(expression, code):
    with pytest.raises(CalculatorError) as caught:
        evaluate(expression)
    assert caught.value.code == code
    assert caught.value.message and str(caught.value) == caught.value.message


def test_nesting_up_to_the_limit_is_fine():
    assert evaluate("(" * MAX_DEPTH + "2" + ")" * MAX_DEPTH).value == 2


def test_the_largest_values_it_takes_are_bounded_in_bits():
    assert evaluate("2^1000").value == 2**1000
    with pytest.raises(CalculatorError):
        evaluate("2^1000 * 2^100")
    result = evaluate("(2^1000 - 1) / (2^999 + 1)")
    assert max(result.value.numerator.bit_length(), result.value.denominator.bit_length()) <= MAX_BITS


ADVERSARIAL = [
    "9^9^9", "2^" * 31 + "2", "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH, "1/3+" * 49 + "1",
    "(2^1000-1)/(2^999+1)*" * 4 + "1", "sqrt(" * 16 + "2" + ")" * 16, "9" * MAX_LENGTH,
    "1e307*1e307", "(1/7)^146", "7^364", "0.000001^50", "1+" * 99 + "1", "-" * 32 + "1",
    "123456789^37/987654321^37", "3^3^3^3", "(10^300+1)/(10^300-1)",
]


def test_no_expression_within_the_limits_costs_more_than_a_few_milliseconds():
    slowest = 0.0
    for expression in ADVERSARIAL:
        began = time.perf_counter()
        try:
            evaluate(expression[:MAX_LENGTH])
        except CalculatorError:
            pass
        slowest = max(slowest, time.perf_counter() - began)
    assert slowest < 0.05, slowest  # generous for a busy machine; each is well under a millisecond alone
