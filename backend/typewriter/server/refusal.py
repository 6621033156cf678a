"""Every door's refusal: a named code and a sentence a person can act on (docs/protocol.md lists the codes).

A chat is checked and refused the same way whichever door it came through; each door only says the refusal in its
own shape: an `error` frame on the socket, an HTTP status with an OpenAI error body, a gRPC status with the code in
its trailing metadata.
"""

from __future__ import annotations

ERROR_CODES = ("invalid_json", "invalid_request", "system_prompt_not_allowed", "prompt_too_long", "busy", "overloaded",
               "not_found", "rate_limited", "shutdown", "internal", "not_supported")


class Refusal(Exception):
    """A chat or message the server will not take, and why; the connection it came on stays usable."""

    def __init__(self, code: str, message: str, request_id: str | None = None, retry_after_s: float | None = None):
        """`retry_after_s`: when trying again may succeed (rate_limited), for front doors that can say so."""
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code, self.message, self.request_id = code, message, request_id
        self.retry_after_s = retry_after_s
