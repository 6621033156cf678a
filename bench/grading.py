"""Grading a free-form maths answer: its final number, compared with the gold one, and the language it is in.

The final number is the last one inside the last LaTeX \\boxed{...} if the answer boxes one, else the last number
in the text. Numbers are read as people write them: "1,500" and "$1,500.00" are 1500, "18." is 18, "3/4" and
\\frac{3}{4} are 0.75, full-width digits count, and in a Spanish answer "1.500" is 1500 and "0,25" is 0.25.
Numbers compare by value, so "18.0" is right where the gold is "18".

The language check is by script and stopwords, enough to tell the three languages the questions come in apart:
an answer whose letters are mostly Han characters is Chinese; otherwise Spanish or English by which language's
common words it uses more.
"""

from __future__ import annotations

import re
import unicodedata

_BOXED = re.compile(r"\\boxed\s*\{")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
# a number: thousands grouped by commas, or plain digits, with decimals, then an optional "/denominator"; in
# Spanish, digits in groups split by dots or commas, read by _plain
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+(?:\.\d+)?)?")
_NUMBER_ES = re.compile(r"(?<![\w.,])-?\d+(?:[.,]\d+)*(?:\s*/\s*\d+(?:[.,]\d+)?)?")


def final_number(text: str, language: str = "en") -> float | None:
    """The answer's final number, or None when it writes none."""
    text = unicodedata.normalize("NFKC", text)
    boxed = _last_boxed(text)
    if boxed is not None:
        found = _numbers(boxed, language)
        if found:
            return found[-1]
    found = _numbers(text, language)
    return found[-1] if found else None


def same_number(got: float | None, gold: str) -> bool:
    if got is None:
        return False
    want = float(gold.replace(",", ""))
    return abs(got - want) <= 1e-6 * max(1.0, abs(want))


def _last_boxed(text: str) -> str | None:
    """What the last \\boxed{...} holds, braces balanced."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, i = 1, starts[-1]
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[starts[-1]:i - 1] if depth == 0 else text[starts[-1]:]


def _numbers(text: str, language: str) -> list[float]:
    text = _FRAC.sub(lambda m: f" {m[1]}/{m[2]} ", text)
    pattern = _NUMBER_ES if language == "es" else _NUMBER
    values = []
    for match in pattern.finditer(text):
        value = _value(match[0], language)
        if value is not None:
            values.append(value)
    return values


def _value(written: str, language: str) -> float | None:
    top, _, bottom = written.partition("/")
    try:
        numerator = _plain(top.strip(), language)
        if not bottom:
            return numerator
        denominator = _plain(bottom.strip(), language)
        return numerator / denominator if denominator else None
    except ValueError:
        return None


def _plain(written: str, language: str) -> float:
    if language != "es":
        return float(written.replace(",", ""))
    groups = re.split(r"[.,]", written.lstrip("-"))
    marks = re.findall(r"[.,]", written)
    if len(set(marks)) == 2:  # "1.500,25" (or "1,500.25"): the last mark is the decimal one
        decimal = marks[-1]
        whole, _, fraction = written.rpartition(decimal)
        return float(re.sub(r"[.,]", "", whole) + "." + fraction)
    if marks and all(len(g) == 3 for g in groups[1:]) and (len(marks) > 1 or marks[0] == "." or len(groups[0]) <= 3):
        return float(re.sub(r"[.,]", "", written))  # "1.500", "60,000", "1.000.000": groups of thousands
    if len(marks) > 1:
        raise ValueError(written)
    return float(written.replace(",", "."))  # "0,25", "2.5"


# Common words of one language that the other rarely writes (words both write, such as "a", "no", "total", are
# left out).
_SPANISH = frozenset([
    "de", "la", "que", "el", "en", "y", "los", "se", "del", "las", "por", "un", "para", "con", "una", "es", "su",
    "al", "lo", "como", "más", "pero", "sus", "le", "ya", "este", "porque", "esta", "entre", "cuando", "muy", "sin",
    "sobre", "también", "me", "hasta", "hay", "donde", "desde", "todo", "nos", "durante", "todos", "uno", "les",
    "ni", "eso", "esto", "qué", "unos", "otro", "otra", "él", "tanto", "esa", "estos", "mucho", "ella", "estar",
    "estas", "algo", "tiene", "son", "cada", "cuántos", "cuántas", "entonces", "primero", "paso", "respuesta",
    "tenemos", "ahora", "vamos"])
_ENGLISH = frozenset([
    "the", "and", "of", "to", "is", "in", "that", "it", "for", "you", "with", "as", "are", "this", "be", "on",
    "have", "we", "so", "each", "how", "many", "what", "there", "they", "she", "he", "has", "then", "first", "step",
    "answer", "now", "let's", "let", "was", "were", "will", "which", "by", "from", "can", "do", "if"])
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")
_LEFT_OUT = re.compile(r"```.*?```|\$\$.*?\$\$|\$[^$\n]*\$|\\\(.*?\\\)|\\\[.*?\\\]|`[^`]*`", re.DOTALL)


def answer_language(text: str) -> str:
    """"zh", "es", "en", or "none" for an answer without words; formulas and code are left out."""
    prose = _LEFT_OUT.sub(" ", text)
    letters = [c for c in prose if c.isalpha()]
    if not letters:
        return "none"
    han = sum("\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf" for c in letters)
    if han >= 0.3 * len(letters):
        return "zh"
    words = [w.lower() for w in _WORD.findall(prose)]
    spanish = sum(w in _SPANISH for w in words)
    english = sum(w in _ENGLISH for w in words)
    return "es" if spanish > english else "en"
