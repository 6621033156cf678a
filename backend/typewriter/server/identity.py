"""Who a client is, the same on every door: the holder of an API key from the classes file (a class, or one student
of it), else a student of the page (a cookie the server issued and signed), else its address. Limits, fair shares
and kept chats count against it; a conversation's cache is shared by one person's chats only.

A student cookie is `<id>.<class>.<mac>`: 16 random bytes, the class joined (base64url, "-" for none) and an HMAC
of both under the server's secret, so a cookie the server did not issue, or one with a changed class, is ignored as
if none were sent: its bearer gets a fresh identity or is its address, never another's. It is HttpOnly, so the
page's scripts never see it, and SameSite=Lax, so another site's page cannot use it.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from starlette.requests import cookie_parser

from ..engine.request import Share
from .auth import bearer
from .classes import Classes, Classroom, key_digest

COOKIE = "typewriter-student"
COOKIE_MAX_AGE_S = 365 * 86400  # a school year: a student keeps their identity, and their class, until it ends
STUDENT_ID = re.compile(r"[A-Za-z0-9_-]{22}")


class Kind(enum.StrEnum):
    KEY = "key"
    STUDENT = "student"
    ADDRESS = "address"


@dataclass(frozen=True)
class Identity:
    """`id` is what the limits, the fair share and kept chats count; an address with neither key nor cookie is
    its own id, so that it counts as the address does."""

    id: str
    address: str
    kind: Kind
    classroom: Classroom
    personal: bool  # one person's: their conversations' cache is theirs across sockets, tabs and requests

    @property
    def chats_per_minute(self) -> int:
        return self.classroom.chats_per_minute

    @property
    def chats_at_once(self) -> int:
        return self.classroom.chats_at_once

    @property
    def share(self) -> Share:
        return Share(self.id, self.classroom.name, self.classroom.weight)


@dataclass(frozen=True)
class Student:
    id: str
    classroom: Classroom | None  # the class joined; None: none, or one the classes file no longer has


class Identities:
    def __init__(self, classes: Classes, secret: str = ""):
        """`secret` "": a random one, so that cookies from before a restart are ignored."""
        self.classes = classes
        self._secret = secret.encode() if secret else secrets.token_bytes(32)

    def resolve(self, address: str, authorization: str | None = None, cookies: str | None = None) -> Identity | None:
        """Who sent a request from `address` with these `Authorization` and `Cookie` headers; None when the server
        serves its classes only and this is in none (its door refuses it)."""
        key = bearer(authorization)
        holder = self.classes.by_key(key) if key is not None else None
        if holder is not None:
            who = f"key:{key_digest(key or '').hex()[:32]}"  # names the key without holding it
            return Identity(who, address, Kind.KEY, holder.classroom, holder.student is not None)
        student = self.student(cookies)
        if student is not None:
            classroom = student.classroom or self.default
            return None if classroom is None else Identity(f"student:{student.id}", address, Kind.STUDENT,
                                                           classroom, True)
        return None if self.default is None else self.address(address)

    def address(self, address: str) -> Identity:
        """`address` as a client of its own, in the default class: what a door counts a connection against before
        it knows more, or when it will refuse the request anyway."""
        return Identity(address, address, Kind.ADDRESS, self.classes.default, False)

    def counted(self, address: str, authorization: str | None = None, cookies: str | None = None) -> Identity:
        """As `resolve`, or its address where that is None: whom a connection counts against either way."""
        return self.resolve(address, authorization, cookies) or self.address(address)

    @property
    def default(self) -> Classroom | None:
        """The class of those in none, unless the server serves its classes only."""
        return self.classes.default if self.classes.open else None

    def student(self, cookies: str | None) -> Student | None:
        """The student a `Cookie` header names, if this server issued its cookie; None for any other."""
        value = cookie_parser(cookies or "").get(COOKIE, "")
        payload, _, mac = value.rpartition(".")
        student_id, _, joined = payload.partition(".")
        if not STUDENT_ID.fullmatch(student_id) or not hmac.compare_digest(mac.encode(), self._sign(payload)):
            return None
        if joined == "-":
            return Student(student_id, None)
        try:
            name = base64.urlsafe_b64decode(joined + "=" * (-len(joined) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        return Student(student_id, self.classes.named(name))

    def cookie(self, student: Student) -> str:
        """The cookie's value for `student`."""
        name = student.classroom.name if student.classroom is not None and student.classroom is not \
            self.classes.default else None
        joined = base64.urlsafe_b64encode(name.encode()).decode().rstrip("=") if name is not None else "-"
        payload = f"{student.id}.{joined}"
        return f"{payload}.{self._sign(payload).decode()}"

    @staticmethod
    def new_student(classroom: Classroom | None) -> Student:
        return Student(secrets.token_urlsafe(16), classroom)

    def _sign(self, payload: str) -> bytes:
        mac = hmac.new(self._secret, f"{COOKIE}\0{payload}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=")


def set_cookie_header(value: str, secure: bool) -> tuple[bytes, bytes]:
    """The `Set-Cookie` header for a student cookie: for this site's pages and sockets only, out of scripts' reach."""
    flags = f"; Max-Age={COOKIE_MAX_AGE_S}; Path=/; HttpOnly; SameSite=Lax" + ("; Secure" if secure else "")
    return b"set-cookie", f"{COOKIE}={value}{flags}".encode("latin-1")
