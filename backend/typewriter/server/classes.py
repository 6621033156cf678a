"""The classes a server teaches, from `--classes PATH` (a TOML file; docs/configuration.md shows one): each a name,
an API key and/or a join code, a weight against the other classes, the tutor's instructions and its students'
limits. Read and checked once at start: a bad file is an error naming its line and field, before the model loads.
Without a file there is one class, the default, whose settings are the server's own.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import ConfigError, Settings

DEFAULT = "default"  # the class of those who joined none (its name in /metrics and /readyz)
NAME = re.compile(r"[^\x00-\x1f\x7f]{1,64}")
JOIN = re.compile(r"[A-Za-z0-9-]{6,32}")  # typed by students, so letters, digits and dashes; long enough not to guess
KEY = re.compile(r"[A-Za-z0-9._~+/=-]{24,256}")  # a bearer token's characters; long enough not to guess
MAX_WEIGHT = 1000.0
MAX_TEXT = 8000  # characters of a tutor's prompt
TOP = ("open", "default", "class")
CLASS = ("name", "key", "join", "weight", "max_tokens", "chats_per_minute", "chats_at_once", "tutor", "students")
TUTOR = ("subject", "language", "guided", "prompt")
GUIDED = ("Guide the student one step at a time: never give the whole solution at once. Give one hint or one "
          "step, then ask the student to take the next step themselves, and wait for their answer.")


@dataclass(frozen=True)
class Tutor:
    subject: str = ""
    language: str = ""  # what every answer is written in; "" as the student writes
    guided: bool = False
    prompt: str | None = None  # instead of the server's system prompt

    def system_prompt(self, base: str) -> str:
        """`base`, the server's system prompt, with this tutor's instructions; its own prompt instead, if it has
        one."""
        parts = [self.prompt if self.prompt is not None else base]
        if self.subject:
            parts.append(f"You tutor {self.subject}: bring questions on other things back to {self.subject}, "
                         "kindly.")
        if self.language:
            parts.append(f"Always answer in {self.language}, whatever language the student writes in.")
        if self.guided:
            parts.append(GUIDED)
        return " ".join(p for p in parts if p)

    @property
    def plain(self) -> bool:
        return self == Tutor()


@dataclass(frozen=True)
class Classroom:
    """One class, its limits filled in from the server's settings where the file gives none."""

    name: str
    max_tokens: int  # the longest answer its students may ask for
    chats_per_minute: int  # per student
    chats_at_once: int  # per student
    weight: float = 1.0
    tutor: Tutor = field(default_factory=Tutor)
    join: str | None = None  # upper case: codes are typed, so any case joins
    has_key: bool = False

    def public(self) -> dict[str, Any]:
        """What its own members may read of it (`GET /v1/class`): never its key or join code."""
        t = self.tutor
        return {"name": self.name, "weight": self.weight, "max_tokens": self.max_tokens,
                "chats_per_minute": self.chats_per_minute, "chats_at_once": self.chats_at_once,
                "tutor": {"subject": t.subject, "language": t.language, "guided": t.guided,
                          "prompt": t.prompt}}


@dataclass(frozen=True)
class KeyHolder:
    """Whom an API key names: a class (everyone using it one client), or one student of it."""

    classroom: Classroom
    student: str | None = None


@dataclass(frozen=True)
class Classes:
    default: Classroom
    listed: tuple[Classroom, ...] = ()
    open: bool = True  # those in no class are served, as the default class
    keys: Mapping[bytes, KeyHolder] = field(default_factory=dict)  # by the key's SHA-256
    joins: Mapping[str, Classroom] = field(default_factory=dict)

    @classmethod
    def only_default(cls, settings: Settings) -> Classes:
        return cls(_classroom({}, DEFAULT, settings, _Where("", "")))

    def by_key(self, key: str) -> KeyHolder | None:
        """Looked up by digest, so that the time taken says nothing of how much of a key matched."""
        return self.keys.get(key_digest(key))

    def by_join(self, code: str) -> Classroom | None:
        return self.joins.get(code.strip().upper())

    def named(self, name: str) -> Classroom | None:
        if name == DEFAULT:
            return self.default
        return next((c for c in self.listed if c.name == name), None)

    @property
    def all(self) -> tuple[Classroom, ...]:
        return (self.default, *self.listed)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def load_classes(settings: Settings) -> Classes:
    """The classes of `settings.identity.classes`, or the default alone; ConfigError names the file, line and field
    of the first thing wrong in it."""
    path = settings.identity.classes
    if path is None:
        return Classes.only_default(settings)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError("classes", f"cannot read the classes file: {e.strerror or e}", source=path) from None
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError("classes", f"not a TOML file: {e}", source=path) from None
    return parse_classes(data, settings, _Where(path, text))


def parse_classes(data: dict[str, Any], settings: Settings, where: _Where | None = None) -> Classes:
    """The classes of a parsed file; `where` names the file and finds lines for its errors."""
    where = where or _Where("", "")
    _only(data, TOP, "the file", where)
    is_open = data.get("open", True)
    if not isinstance(is_open, bool):
        raise where.error("open", "must be true or false")
    default_table = data.get("default", {})
    if not isinstance(default_table, dict):
        raise where.error("default", "must be a table ([default]) of the settings of those in no class")
    for name in ("name", "key", "join", "students"):
        if name in default_table:
            raise where.error(f"default.{name}", "the default class has no name, key, join code or students: it "
                                                 "is for those in no class")
    default = _classroom(default_table, DEFAULT, settings, where.within("default"))
    tables = data.get("class", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise where.error("class", "each class must be a [[class]] table")
    listed: list[Classroom] = []
    keys: dict[bytes, KeyHolder] = {}
    joins: dict[str, Classroom] = {}
    names = {DEFAULT}
    server_key = settings.access.api_key
    for n, table in enumerate(tables):
        at = where.within("class", n)
        _only(table, CLASS, "a class", at)
        name = table.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name) or name != name.strip():
            raise at.error("name", "must be the class's name, 1 to 64 characters without control characters or "
                                   "spaces around it")
        if name.lower() in {n.lower() for n in names}:
            raise at.error("name", f"{name!r} is taken (by another class, or the default class)")
        names.add(name)
        at = where.within("class", n, name)
        classroom = _classroom(table, name, settings, at)
        for key, holder, field_name in _keys(table, classroom, at):
            digest = key_digest(key)
            if digest in keys or key == server_key:
                raise at.error(field_name, "this key is given twice (or is the server's API_KEY): each key must "
                                           "name one class or student")
            keys[digest] = holder
        if classroom.join is not None:
            if classroom.join in joins:
                raise at.error("join", f"the join code is {joins[classroom.join].name!r}'s too (codes are the "
                                       "same in any case)")
            joins[classroom.join] = classroom
        if classroom.join is None and not classroom.has_key:
            raise at.error("name", f"class {name!r} has no key and no join code, so nobody can be in it")
        listed.append(classroom)
    return Classes(default, tuple(listed), is_open, keys, joins)


def _classroom(table: dict[str, Any], name: str, settings: Settings, at: _Where) -> Classroom:
    cap = settings.answers.length_cap
    limits = settings.limits
    max_tokens = _int(table, "max_tokens", 1, cap, cap, at, f"the server's max_new_tokens_cap ({cap})")
    weight = table.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
            or not 0 < weight <= MAX_WEIGHT:
        raise at.error("weight", f"must be a number greater than 0 and at most {MAX_WEIGHT:g}, got {weight!r}")
    join = table.get("join")
    if join is not None and (not isinstance(join, str) or not JOIN.fullmatch(join)):
        raise at.error("join", "must be a code of 6 to 32 letters, digits or dashes, such as ALG1-7QX2")
    key = table.get("key")
    if key is not None and (not isinstance(key, str) or not KEY.fullmatch(key)):
        raise at.error("key", "must be 24 to 256 letters, digits or ._~+/=- characters (a random one, such as "
                              "`openssl rand -base64 32` makes)")
    return Classroom(name, max_tokens,
                     _int(table, "chats_per_minute", 1, 1_000_000, limits.chats_per_student, at),
                     _int(table, "chats_at_once", 1, 1_000_000, limits.at_once_per_student, at),
                     float(weight), _tutor(table.get("tutor", {}), at), join.upper() if join else None,
                     key is not None or bool(table.get("students")))


def _tutor(table: object, at: _Where) -> Tutor:
    if not isinstance(table, dict):
        raise at.error("tutor", "must be a table ([class.tutor]) of subject, language, guided and prompt")
    _only(table, TUTOR, "tutor", at, "tutor.")
    values: dict[str, Any] = {}
    for name, most in (("subject", 200), ("language", 64), ("prompt", MAX_TEXT)):
        value = table.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > most or "\x00" in value):
            raise at.error(f"tutor.{name}", f"must be text of at most {most} characters")
        if value is not None:
            values[name] = value.strip()
    guided = table.get("guided", False)
    if not isinstance(guided, bool):
        raise at.error("tutor.guided", "must be true or false")
    return Tutor(guided=guided, **values)


def _keys(table: dict[str, Any], classroom: Classroom, at: _Where) -> Iterator[tuple[str, KeyHolder, str]]:
    if table.get("key") is not None:
        yield table["key"], KeyHolder(classroom), "key"
    students = table.get("students", {})
    if not isinstance(students, dict):
        raise at.error("students", "must be a table of student names and their API keys")
    for student, key in students.items():
        if not NAME.fullmatch(student):
            raise at.error("students", f"{student[:64]!r}: a student's name is 1 to 64 characters")
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise at.error(f"students.{student}", "must be the student's API key, 24 to 256 letters, digits or "
                                                  "._~+/=- characters")
        yield key, KeyHolder(classroom, student), f"students.{student}"


def _int(table: dict[str, Any], name: str, low: int, high: int, default: int, at: _Where,
         high_is: str | None = None) -> int:
    value = table.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise at.error(name, f"must be a whole number from {low} to {high_is or high}, got {value!r}")
    return value


def _only(table: dict[str, Any], known: tuple[str, ...], what: str, at: _Where, prefix: str = "") -> None:
    unknown = sorted(k for k in table if k not in known)
    if unknown:
        raise at.error(f"{prefix}{unknown[0]}", f"not a field of {what}; known: {', '.join(known)}")


class _Where:
    """Names where in the file a field is: its path and the line it is on (or its table's)."""

    def __init__(self, path: str, text: str, table: str | None = None, index: int | None = None,
                 name: str | None = None):
        self.path, self.text, self.table, self.index, self.name = path, text, table, index, name

    def within(self, table: str, index: int | None = None, name: str | None = None) -> _Where:
        return _Where(self.path, self.text, table, index, name)

    def error(self, name: str, problem: str) -> ConfigError:
        if self.table is None:
            label = name
        elif self.index is None:
            label = f"{self.table}.{name}"
        else:
            label = f"class {self.name!r}: {name}" if self.name else f"[[class]] #{self.index + 1}: {name}"
        source = f"{self.path}:{self._line(name)}" if self.path else None
        return ConfigError("classes", f"{label}: {problem}", source=source)

    def _line(self, name: str) -> int:
        """The line of `name` (`tutor.subject` is `subject` under `[class.tutor]` or in an inline table) within
        this table, else of the sub-table it names, else the table's own line; 1 when the table is not found."""
        lines = self.text.splitlines()
        start, end = 0, len(lines)
        if self.table is not None:
            own = re.compile(r"\s*\[\[\s*class\s*\]\]" if self.table == "class" else r"\s*\[\s*default\s*\]")
            headers = [i for i, line in enumerate(lines) if own.match(line)]
            if (self.index or 0) >= len(headers):
                return 1
            start = headers[self.index or 0]
            inner = re.compile(rf"\s*\[\s*{self.table}\.")
            end = next((i for i in range(start + 1, len(lines))
                        if re.match(r"\s*\[", lines[i]) and not inner.match(lines[i])), len(lines))
        leaf = re.escape(name.rsplit(".", 1)[-1])
        assignment = re.compile(rf"\s*[\"']?{leaf}[\"']?\s*=")
        table = re.compile(rf"\s*\[\s*\w+\.{re.escape(name.split('.')[0])}\s*\]")
        for pattern in (assignment, table):
            found = next((i for i in range(start, end) if pattern.match(lines[i])), None)
            if found is not None:
                return found + 1
        return start + 1
