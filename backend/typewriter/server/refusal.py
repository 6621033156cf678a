"""A refusal: a named code and a sentence a person can act on (docs/protocol.md lists the codes). Every door
refuses the same way and only says it in its own shape: an `error` frame, an HTTP status, a gRPC status."""

from __future__ import annotations

ERROR_CODES = ("invalid_json", "invalid_request", "system_prompt_not_allowed", "prompt_too_long", "busy", "overloaded",
               "not_found", "rate_limited", "shutdown", "internal", "not_supported")


class Refusal(Exception):
    """A chat or message the server will not take, and why; the connection it came on stays usable."""

    def __init__(self, code: str, message: str, request_id: str | None = None, retry_after_s: float | None = None):
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code, self.message, self.request_id = code, message, request_id
        self.retry_after_s = retry_after_s
