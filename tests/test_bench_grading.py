"""bench/grading.py reads the final number and the language of an answer as a person would."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from grading import answer_language, final_number, same_number


@pytest.mark.parametrize(("text", "language", "want"), [
    ("She sells 9 eggs at $2 each, so she makes $18.", "en", 18),
    ("The total is 1,500 dollars.", "en", 1500),
    ("So the answer is $1,234.50", "en", 1234.5),
    ("First 16 - 3 - 4 = 9, then 9 * 2 = \\boxed{18} dollars. Do you see step 3?", "en", 18),
    ("\\boxed{\\frac{3}{4}}", "en", 0.75),
    ("Each cap is worth $.25", "en", 0.25),
    ("Jenny has 3/4 of the pizza", "en", 0.75),
    ("The temperature is -5 degrees", "en", -5),
    ("所以她每天赚 １８ 美元。", "zh", 18),
    ("Le quedan 1.500 euros", "es", 1500),
    ("Cada chapa vale 0,25 dólares", "es", 0.25),
    ("En total son 60,000 horas.", "es", 60000),
    ("Gana $7.5 al día", "es", 7.5),
    ("No number here.", "en", None),
])
def test_final_number(text, language, want):
    got = final_number(text, language)
    assert got == pytest.approx(want) if want is not None else got is None


def test_numbers_compare_by_value():
    assert same_number(18.0, "18")
    assert same_number(60000, "60,000")
    assert not same_number(17.99, "18")
    assert not same_number(None, "18")


@pytest.mark.parametrize(("text", "want"), [
    ("First, let's find how many eggs she has left. Then we multiply by the price.", "en"),
    ("Primero, vamos a calcular cuántos huevos le quedan. Luego multiplicamos por el precio.", "es"),
    ("首先，我们算出她还剩多少个鸡蛋，然后乘以价格 $9 \\times 2 = 18$。", "zh"),
    ("$$9 \\times 2 = 18$$", "none"),
])
def test_answer_language(text, want):
    assert answer_language(text) == want
