"""The page, `GET /`: where a student gets their identity (a signed cookie, identity.py), at most
`identities_per_minute` new ones an address, and joins a class by `/?class=CODE`. A code that names no class counts
against the address as a failed look-up does, so codes cannot be guessed. Joining redirects to `/`, so that the code
leaves the address bar; a server that serves its classes only shows a student in none the join form alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from .identity import Identities, Student, set_cookie_header
from .lifecycle import ServerState
from .limits import client_address, forwarded_https

MAX_CODE = 64  # longer is no class's code: refused before it is looked up


@dataclass
class Visit:
    student: Student | None  # None: none could be issued; the page's chats count as its address's
    cookie: str | None = None  # a cookie to set: a new student, or a class joined
    note: str | None = None  # what the page says about the code it was given
    joined: bool = False


def visit(state: ServerState, address: str, cookies: str | None, code: str | None) -> Visit:
    identities, limits = state.identities, state.limits
    student = identities.student(cookies)
    joining, note = None, None
    if code is not None:
        wait_s = limits.looking_blocked(address)
        joining = state.classes.by_join(code) if wait_s is None and len(code) <= MAX_CODE else None
        if wait_s is not None:
            note = f"Too many class codes were tried from your network; try again in {math.ceil(wait_s)} s."
        elif joining is None:
            limits.missed(address)
            note = "That class code is not known here: check it with your teacher."
    if student is None:
        wait_s = limits.issue_identity(address)
        if wait_s is None:
            student = Identities.new_student(joining)
            return Visit(student, identities.cookie(student), note, joining is not None)
        if joining is not None:
            note = f"Too many students joined from your network this minute; try again in {math.ceil(wait_s)} s."
        return Visit(None, None, note)
    if joining is not None and student.classroom is not joining:
        student = Student(student.id, joining)
        return Visit(student, identities.cookie(student), note, True)
    return Visit(student, None, note, joining is not None)


class Page:
    def __init__(self, state: ServerState, templates: Jinja2Templates):
        self.state, self.templates = state, templates

    async def index(self, request: Request) -> Response:
        state = self.state
        peer = request.client.host if request.client else None
        address = client_address(peer, request.headers, state.limits.trusted)
        seen = visit(state, address, request.headers.get("cookie"), request.query_params.get("class"))
        https = request.url.scheme == "https" or forwarded_https(peer, request.headers, state.limits.trusted)
        headers = [set_cookie_header(seen.cookie, https)] if seen.cookie is not None else []
        if seen.joined:
            response: Response = RedirectResponse("/", status_code=303)
        else:
            response = self.templates.TemplateResponse(request, "index.html", self._context(seen))
        response.raw_headers.extend(headers)
        return response

    def _context(self, seen: Visit) -> dict[str, Any]:
        state, settings = self.state, self.state.settings
        classroom = seen.student.classroom if seen.student is not None else None
        joined = classroom or state.identities.default
        cap = min(joined.max_tokens, settings.answers.length_cap) if joined is not None else 0
        config = {
            "protocol": 1, "ws_path": "/ws", "readyz_path": "/readyz", "model": settings.model.id,
            "max_new_tokens": min(settings.answers.default_length, cap), "max_new_tokens_cap": cap,
            "max_message_bytes": settings.socket.max_message_bytes, "max_messages": settings.socket.max_messages,
            "class": classroom.name if classroom is not None else None,
        }
        return {"config": config, "classroom": classroom, "note": seen.note, "join_only": joined is None,
                "joinable": bool(state.classes.joins)}
