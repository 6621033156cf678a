"""Who a client is: a key of the classes file first, then a student cookie this server signed, then the address. A
cookie that was changed, made up, or signed by another server names nobody; a class the file no longer has is
none."""

from __future__ import annotations

import pytest

from typewriter.config import Settings
from typewriter.server.classes import Classes, parse_classes
from typewriter.server.identity import COOKIE, Identities, Kind, Student, set_cookie_header

KEY, ANA_KEY = "a" * 24, "b" * 24


def school(open_: bool = True) -> Classes:
    data = {"open": open_, "class": [
        {"name": "Algebra", "join": "ALG-123", "weight": 2, "chats_at_once": 3,
         "students": {"ana": ANA_KEY}},
        {"name": "Biology", "key": KEY}]}
    return parse_classes(data, Settings())


def header(value: str) -> str:
    return f"theme=dark; {COOKIE}={value}"


@pytest.fixture
def ids() -> Identities:
    return Identities(school(), "s" * 32)


def test_a_cookie_names_its_student_and_class_until_it_changes(ids):
    algebra = ids.classes.by_join("alg-123")
    student = Identities.new_student(algebra)
    cookie = ids.cookie(student)
    assert ids.student(header(cookie)) == student
    who = ids.resolve("192.0.2.1", None, header(cookie))
    assert (who.id, who.kind, who.classroom, who.personal) == (f"student:{student.id}", Kind.STUDENT, algebra, True)
    assert who.share.group == "Algebra" and who.share.weight == 2.0 and who.chats_at_once == 3


@pytest.mark.parametrize("change", [
    lambda c: c[:-2] + ("AA" if not c.endswith("AA") else "BB"),  # the signature
    lambda c: "X" + c[1:] if c[0] != "X" else "Y" + c[1:],  # the student id
    lambda c: c.replace(".QWxnZWJyYQ.", ".QmlvbG9neQ."),  # another class, under the same signature
    lambda c: c.replace(".QWxnZWJyYQ.", ".-."),  # no class
    lambda c: c.rpartition(".")[0],  # no signature
    lambda c: "",
    lambda c: "a.b.c.d",
])
def test_a_changed_cookie_names_nobody(ids, change):
    cookie = ids.cookie(Identities.new_student(ids.classes.by_join("ALG-123")))
    assert ".QWxnZWJyYQ." in cookie  # "Algebra"
    assert ids.student(header(change(cookie))) is None
    assert ids.resolve("192.0.2.1", None, header(change(cookie))).kind is Kind.ADDRESS


def test_another_servers_cookie_names_nobody_here(ids):
    other = Identities(school(), "t" * 32)
    assert ids.student(header(other.cookie(Identities.new_student(None)))) is None
    random = Identities(school())  # a restart without a configured secret
    assert random.student(header(ids.cookie(Identities.new_student(None)))) is None


def test_a_key_wins_over_a_cookie_and_a_cookie_over_the_address(ids):
    cookie = header(ids.cookie(Identities.new_student(None)))
    by_key = ids.resolve("192.0.2.1", f"Bearer {KEY}", cookie)
    assert (by_key.kind, by_key.classroom.name, by_key.personal) == (Kind.KEY, "Biology", False)
    assert KEY not in by_key.id  # the key is never what is kept and logged
    ana = ids.resolve("192.0.2.1", f"Bearer {ANA_KEY}")
    assert (ana.kind, ana.classroom.name, ana.personal) == (Kind.KEY, "Algebra", True) and ana.id != by_key.id
    assert ids.resolve("192.0.2.1", "Bearer unused", cookie).kind is Kind.STUDENT  # an unknown key: not a class's
    plain = ids.resolve("192.0.2.1", "Bearer unused")
    assert (plain.id, plain.kind, plain.classroom.name, plain.personal) == ("192.0.2.1", Kind.ADDRESS, "default", False)


def test_a_server_for_its_classes_only_names_nobody_outside_them():
    ids = Identities(school(open_=False), "s" * 32)
    assert ids.resolve("192.0.2.1") is None
    assert ids.resolve("192.0.2.1", None, header(ids.cookie(Identities.new_student(None)))) is None
    joined = ids.resolve("192.0.2.1", None, header(ids.cookie(Identities.new_student(ids.classes.by_join("ALG-123")))))
    assert joined.classroom.name == "Algebra"
    assert ids.resolve("192.0.2.1", f"Bearer {KEY}").classroom.name == "Biology"
    assert ids.counted("192.0.2.1").kind is Kind.ADDRESS  # what a refused connection still counts against


def test_a_class_the_file_no_longer_has_is_none(ids):
    renamed = Identities(Classes(ids.classes.default), "s" * 32)
    cookie = header(ids.cookie(Identities.new_student(ids.classes.by_join("ALG-123"))))
    assert renamed.student(cookie).classroom is None
    assert renamed.resolve("192.0.2.1", None, cookie).classroom.name == "default"


def test_the_cookie_is_for_this_sites_pages_only_out_of_scripts_reach():
    name, value = set_cookie_header("v", secure=True)
    assert name == b"set-cookie"
    assert value == (f"{COOKIE}=v; Max-Age=31536000; Path=/; HttpOnly; SameSite=Lax; Secure").encode()
    assert b"Secure" not in set_cookie_header("v", secure=False)[1]


def test_a_student_with_no_class_keeps_it_none():
    ids = Identities(school(), "s" * 32)
    student = Student("A" * 22, None)
    assert ids.student(header(ids.cookie(student))) == student
