"""The page over a real server: it issues each student a signed identity (an HttpOnly cookie), at most
`identities_per_minute` new ones an address; a class is joined by `/?class=CODE`; a cookie that was changed or made
up is ignored, so nobody becomes another student, and a student's kept answer is theirs alone."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from helpers import chat_json, recv_json, until_terminal_async
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect

from typewriter.server.identity import COOKIE

CLASSES = """
[[class]]
name = "Algebra 1"
join = "ALG1-7QX2"
[class.tutor]
subject = "algebra"
guided = true
"""


@pytest.fixture
def classes_file(tmp_path):
    path = tmp_path / "classes.toml"
    path.write_text(CLASSES)
    return str(path)


def cookie_of(response: httpx.Response) -> str | None:
    header = response.headers.get("set-cookie")
    if header is None:
        return None
    assert "HttpOnly" in header and "SameSite=Lax" in header and "Path=/" in header
    return header.split(";", 1)[0].partition("=")[2]


def whoami(address: str, cookie: str | None) -> dict:
    """`GET /v1/class` as the page's scripts would ask it: with the cookie the browser holds."""
    headers = {"cookie": f"{COOKIE}={cookie}"} if cookie else {}
    return httpx.get(f"http://{address}/v1/class", headers=headers).json()


def test_each_new_visitor_gets_an_identity_of_their_own_and_keeps_it(classes_file):
    with running(script_engine(), classes=classes_file) as (_, address):
        first, second = httpx.get(f"http://{address}/"), httpx.get(f"http://{address}/")
        ana, ben = cookie_of(first), cookie_of(second)
        again = httpx.get(f"http://{address}/", headers={"cookie": f"{COOKIE}={ana}"})
        assert ana and ben and ana.split(".")[0] != ben.split(".")[0]
        assert cookie_of(again) is None  # kept, not issued again
        assert whoami(address, ana)["client"] == "student" and whoami(address, None)["client"] == "address"


def test_a_class_is_joined_by_its_code_in_any_case_and_the_page_names_it(classes_file):
    with running(script_engine(), classes=classes_file) as (_, address):
        with httpx.Client(base_url=f"http://{address}") as client:
            joined = client.get("/?class=alg1-7qx2")
            cookie = cookie_of(joined)
            page = client.get("/", headers={"cookie": f"{COOKIE}={cookie}"})
        assert joined.status_code == 303 and joined.headers["location"] == "/"  # the code leaves the address bar
        assert '<p class="class-name" title="Your class">Algebra 1</p>' in page.text
        assert "a step at a time" in page.text  # the page's help says how a guided class goes
        assert json.loads(page.text.split('id="settings">')[1].split("</script>")[0])["class"] == "Algebra 1"
        assert whoami(address, cookie)["name"] == "Algebra 1"


def test_a_student_joining_keeps_their_identity():
    with running(script_engine()) as (_, address):
        plain = cookie_of(httpx.get(f"http://{address}/"))
    assert plain is not None and plain.split(".")[1] == "-"  # in no class


def test_a_wrong_class_code_counts_as_a_miss_and_guessing_is_stopped(classes_file):
    with running(script_engine(), classes=classes_file) as (_, address):
        with httpx.Client(base_url=f"http://{address}") as client:
            tries = [client.get(f"/?class=GUESS-{n:04d}") for n in range(21)]
            right = client.get("/?class=ALG1-7QX2")  # too late: the address is blocked for the minute
    assert all(t.status_code == 200 for t in tries)
    assert "That class code is not known here" in tries[0].text
    assert "Too many class codes were tried" in tries[-1].text and right.status_code == 200
    assert "Too many class codes were tried" in right.text


def test_identities_past_the_issuing_limit_are_not_minted(classes_file):
    with running(script_engine(), classes=classes_file, identities_per_minute=3) as (_, address):
        pages = [httpx.get(f"http://{address}/") for _ in range(5)]
        late_join = httpx.get(f"http://{address}/?class=ALG1-7QX2")
        cookies = [cookie_of(p) for p in pages]
        assert all(p.status_code == 200 for p in pages)  # the page is served all the same
        assert [c is not None for c in cookies] == [True, True, True, False, False]
        assert cookie_of(late_join) is None and "Too many students joined" in late_join.text
        assert whoami(address, cookies[0])["client"] == "student"  # those issued still count


@pytest.mark.parametrize("forge", ["signature", "class", "made_up"])
def test_a_changed_or_made_up_cookie_is_ignored_and_gets_a_fresh_identity(classes_file, forge):
    with running(script_engine(), classes=classes_file) as (_, address):
        ana = cookie_of(httpx.get(f"http://{address}/"))  # in no class
        student, joined, mac = ana.split(".")
        forged = {"signature": f"{student}.{joined}.{mac[::-1]}",
                  "class": f"{student}.QWxnZWJyYSAx.{mac}",  # "Algebra 1", under the no-class signature
                  "made_up": f"{'A' * 22}.-.{'B' * 43}"}[forge]
        page = httpx.get(f"http://{address}/", headers={"cookie": f"{COOKIE}={forged}"})
        fresh = cookie_of(page)
        assert fresh is not None and fresh.split(".")[0] not in (student, forged.split(".")[0])
        assert whoami(address, forged) == whoami(address, None)  # not Ana, not a class: the address
        assert whoami(address, forged)["client"] == "address" and whoami(address, forged)["name"] == "default"


def test_a_students_kept_answer_resumes_only_with_their_own_cookie():
    engine = script_engine(["ab"] * 60, step_s=0.02, slots=1)

    async def scenario(address):
        ana, ben = cookie_of(httpx.get(f"http://{address}/")), cookie_of(httpx.get(f"http://{address}/"))
        student, joined, mac = ana.split(".")
        forged = f"{student}.{joined}.{ben.split('.')[2]}"  # Ana's id under Ben's signature
        url = f"ws://{address}/ws"
        async with connect(url, additional_headers={"cookie": f"{COOKIE}={ana}"}) as ws:
            await ws.send(json.dumps({**json.loads(chat_json("c1", max_new_tokens=60)), "resumable": True}))
            start = await recv_json(ws)
            while start["type"] != "start":
                start = await recv_json(ws)
            token = start["resume_token"]
        outcomes = []
        for cookie in (ben, forged, None, ana):
            headers = {"cookie": f"{COOKIE}={cookie}"} if cookie else {}
            async with connect(url, additional_headers=headers) as ws:
                await ws.send(json.dumps({"type": "resume", "id": "c1", "token": token, "from": 0}))
                first = await recv_json(ws)
                outcomes.append(first.get("code") or first["type"])
                if first["type"] == "resumed":
                    rest = await until_terminal_async(ws, 10)
                    outcomes.append(rest[-1]["type"])
        return outcomes

    with running(engine, resume_grace_s=30) as (_, address):
        outcomes = asyncio.run(scenario(address))
    assert outcomes == ["not_found", "not_found", "not_found", "resumed", "end"]


@pytest.mark.parametrize("garbage", ["é" * 3000, "a.b", "..", "A" * 22 + ".\u00ff\u00fe." + "x" * 43, "=;=;"])
def test_a_cookie_that_is_not_one_names_nobody_and_breaks_nothing(garbage):
    with running(script_engine()) as (_, address):
        headers = {"cookie": f"{COOKIE}={garbage}".encode()}
        page = httpx.get(f"http://{address}/", headers=headers)
        mine = httpx.get(f"http://{address}/v1/class", headers=headers)
    assert page.status_code == 200 and cookie_of(page) is not None
    assert mine.status_code == 200 and mine.json()["client"] == "address"
