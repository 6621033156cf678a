"""The tutor's calculator: an arithmetic expression read by a hand-written parser and evaluated exactly, as fractions.
Nothing is executed: the only names are numbers, `+ - * / ^` (or `**`, and the multiplication and division signs), parentheses, `%` and `sqrt`. The
cost is bounded before any work: the expression's length and nesting, and every value's size (a power is refused
before it is computed when its result would be too large, so `9^9^9` costs nothing).
"""

from __future__ import annotations

import decimal
import math
import re
from dataclasses import dataclass
from fractions import Fraction

MAX_LENGTH = 200  # characters: more than any step of a school problem needs
MAX_DEPTH = 32  # nested parentheses, square roots and signs
MAX_BITS = 1024  # of any value's numerator or denominator: about 300 decimal digits
DECIMAL_DIGITS = 12  # significant digits of a decimal that does not end
EXACT_DECIMALS = 20  # a decimal that ends within this many places is shown whole
SQRT_DIGITS = 30  # significant digits of a square root that is not a fraction

ERROR_CODES = ("not_an_expression", "too_long", "too_large", "division_by_zero", "not_real", "not_supported")

# A number: digits with optional thousands commas, a decimal part, an exponent; or a decimal part alone (".5").
_NUMBER = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?")
_SYMBOLS = {"+": "+", "-": "-", "−": "-", "*": "*", "×": "*", "·": "*", "/": "/", "÷": "/", "^": "^", "(": "(",
            ")": ")", "%": "%", "√": "sqrt"}


class CalculatorError(ValueError):
    """`code` is one of ERROR_CODES; the message is a sentence the model (and the student) can act on."""

    def __init__(self, code: str, message: str):
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Result:
    value: Fraction
    exact: bool = True  # False once a square root that is no fraction was rounded

    @property
    def integer(self) -> str | None:
        return str(self.value.numerator) if self.exact and self.value.denominator == 1 else None

    @property
    def fraction(self) -> str:
        return f"{self.value.numerator}/{self.value.denominator}"

    @property
    def decimal(self) -> str:
        """Exact when it ends within EXACT_DECIMALS places, else rounded to DECIMAL_DIGITS significant digits."""
        places = self._places
        return _exact_decimal(self.value, places) if places is not None else _rounded(self.value, DECIMAL_DIGITS)

    @property
    def ends(self) -> bool:
        """Its decimal is the value exactly."""
        return self._places is not None

    @property
    def _places(self) -> int | None:
        places = _decimal_places(self.value.denominator)
        return places if self.exact and places is not None and places <= EXACT_DECIMALS else None

    @property
    def text(self) -> str:
        """What the student and the model read: `84`, `2.5`, `7/3 ≈ 2.333333333333`, `≈ 1.41421356237`."""
        if self.integer is not None:
            return self.integer
        if self.ends:
            return self.decimal
        return f"{self.fraction} ≈ {self.decimal}" if self.exact else f"≈ {self.decimal}"


def evaluate(expression: str) -> Result:
    """The expression's exact value; raises CalculatorError, never anything else."""
    if len(expression) > MAX_LENGTH:
        raise CalculatorError("too_long", f"an expression may be at most {MAX_LENGTH} characters; split the "
                                          "calculation into steps")
    tokens = _tokens(expression)
    if not tokens:
        raise CalculatorError("not_an_expression", "the expression is empty; send numbers and operators, such "
                                                    "as 12 * 7")
    parser = _Parser(tokens)
    result = parser.expression(0)
    if (extra := parser.peek()) is not None:
        raise CalculatorError("not_an_expression", f"unexpected {_shown(extra)} after a complete expression")
    return result


def _tokens(expression: str) -> list[str | Fraction]:
    text = expression.strip().rstrip("=").rstrip()
    out: list[str | Fraction] = []
    at = 0
    while at < len(text):
        char = text[at]
        if char.isspace():
            at += 1
        elif (number := _NUMBER.match(text, at + (char == "$"))):  # a price's sign is no operator
            out.append(_number(number.group()))
            at = number.end()
        elif text.startswith("**", at):
            out.append("^")
            at += 2
        elif text.startswith("sqrt", at):
            out.append("sqrt")
            at += 4
        elif char in _SYMBOLS:
            out.append(_SYMBOLS[char])
            at += 1
        else:
            raise CalculatorError("not_an_expression", f"{char!r} at {at} is not part of arithmetic: use numbers, "
                                                       "+ - * / ^, parentheses, % and sqrt()")
    return out


def _number(literal: str) -> Fraction:
    mantissa, _, exponent = literal.lower().partition("e")
    whole, _, part = mantissa.replace(",", "").partition(".")
    power = int(exponent) if exponent else 0  # at most MAX_LENGTH digits long: a cheap int
    if abs(power) > 3 * MAX_BITS // 10:
        raise CalculatorError("too_large", f"{literal} is too large or too small for this calculator")
    value = Fraction(int(whole or "0") * 10 ** len(part) + int(part or "0"), 10 ** len(part))
    return _checked(value * Fraction(10) ** power)


class _Parser:
    """Recursive descent: expression := term (+|- term)*; term := unary (*|/ unary)*; unary := (+|-) unary | power;
    power := postfix (^ unary)?, right to left so that 2^3^2 is 2^9 and -2^2 is -4; postfix := primary %*;
    primary := number | ( expression ) | sqrt primary."""

    def __init__(self, tokens: list[str | Fraction]):
        self.tokens, self.at = tokens, 0

    def peek(self) -> str | Fraction | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str | Fraction:
        token = self.peek()
        if token is None:
            raise CalculatorError("not_an_expression", "the expression ends where a number was expected")
        self.at += 1
        return token

    def expression(self, depth: int) -> Result:
        left = self.term(depth)
        while (op := self.peek()) in ("+", "-"):
            self.at += 1
            right = self.term(depth)
            left = _combine(left, right, left.value + right.value if op == "+" else left.value - right.value)
        return left

    def term(self, depth: int) -> Result:
        left = self.unary(depth)
        while (op := self.peek()) in ("*", "/"):
            self.at += 1
            right = self.unary(depth)
            if op == "/" and right.value == 0:
                raise CalculatorError("division_by_zero", "division by zero: the divisor is 0")
            left = _combine(left, right, left.value * right.value if op == "*" else left.value / right.value)
        return left

    def unary(self, depth: int) -> Result:
        if (sign := self.peek()) in ("+", "-"):
            self.at += 1
            inner = self.unary(_deeper(depth))
            return inner if sign == "+" else Result(-inner.value, inner.exact)
        return self.power(depth)

    def power(self, depth: int) -> Result:
        base = self.postfix(depth)
        if self.peek() != "^":
            return base
        self.at += 1
        return _power(base, self.unary(_deeper(depth)))

    def postfix(self, depth: int) -> Result:
        value = self.primary(depth)
        while self.peek() == "%":
            self.at += 1
            value = Result(_checked(value.value / 100), value.exact)
        return value

    def primary(self, depth: int) -> Result:
        token = self.take()
        if isinstance(token, Fraction):
            return Result(token)
        if token == "(":
            inner = self.expression(_deeper(depth))
            if self.take() != ")":
                raise CalculatorError("not_an_expression", "a parenthesis is not closed")
            return inner
        if token == "sqrt":
            return _sqrt(self.primary(_deeper(depth)))
        raise CalculatorError("not_an_expression", f"{_shown(token)} where a number was expected")


def _shown(token: str | Fraction) -> str:
    return f"the number {token}" if isinstance(token, Fraction) else repr(token)


def _deeper(depth: int) -> int:
    if depth + 1 > MAX_DEPTH:
        raise CalculatorError("too_long", f"the expression nests more than {MAX_DEPTH} deep; split it into steps")
    return depth + 1


def _combine(left: Result, right: Result, value: Fraction) -> Result:
    return Result(_checked(value), left.exact and right.exact)


def _checked(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise CalculatorError("too_large", "a value is too large (or has too many digits) for this calculator")
    return value


def _power(base: Result, exponent: Result) -> Result:
    if exponent.value.denominator == 2 and exponent.exact:  # x^(1/2), x^1.5: a square root of a whole power
        return _sqrt(_power(base, Result(exponent.value * 2)))
    if exponent.value.denominator != 1 or not exponent.exact:
        raise CalculatorError("not_supported", "a power must be a whole number (or a half: x^0.5 is sqrt(x))")
    n, value = exponent.value.numerator, base.value
    if value == 0 and n < 0:
        raise CalculatorError("division_by_zero", "division by zero: 0 to a negative power")
    if value not in (0, 1, -1):
        size = max(math.log2(abs(value.numerator) or 1), math.log2(value.denominator))
        if size * abs(n) > MAX_BITS + 1:  # refused before it is computed
            raise CalculatorError("too_large", "the power is too large for this calculator")
    return Result(_checked(value ** n), base.exact)


def _sqrt(x: Result) -> Result:
    if x.value < 0:
        raise CalculatorError("not_real", "the square root of a negative number is not a real number")
    top, bottom = math.isqrt(x.value.numerator), math.isqrt(x.value.denominator)
    if top * top == x.value.numerator and bottom * bottom == x.value.denominator:
        return Result(Fraction(top, bottom), x.exact)
    with decimal.localcontext(decimal.Context(prec=SQRT_DIGITS)):
        root = (decimal.Decimal(x.value.numerator) / decimal.Decimal(x.value.denominator)).sqrt()
    return Result(_checked(Fraction(root)), exact=False)


def _decimal_places(denominator: int) -> int | None:
    """How many places the decimal of a fraction with this (reduced) denominator takes; None if it never ends."""
    twos = (denominator & -denominator).bit_length() - 1
    rest = denominator >> twos
    fives = 0
    while rest % 5 == 0:
        rest //= 5
        fives += 1
    return max(twos, fives) if rest == 1 else None


def _exact_decimal(value: Fraction, places: int) -> str:
    scaled = abs(value.numerator) * 10 ** places // value.denominator  # exact: the denominator divides 10^places
    digits = str(scaled).rjust(places + 1, "0")
    whole, part = digits[: len(digits) - places], digits[len(digits) - places:].rstrip("0")
    return ("-" if value < 0 else "") + whole + (f".{part}" if part else "")


def _rounded(value: Fraction, digits: int) -> str:
    with decimal.localcontext(decimal.Context(prec=digits)):
        d = decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)
    if -7 <= d.adjusted() <= 20:
        text = f"{d:f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return f"{d:e}"
