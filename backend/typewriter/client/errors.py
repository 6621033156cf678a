"""The client's errors: one base class, ClientError, and one class per way a chat can fail."""

from __future__ import annotations

CLOSE_UNSUPPORTED_DATA = 1003  # the client sent a binary frame
CLOSE_POLICY_VIOLATION = 1008  # a cross-origin handshake, or too many frames a second
CLOSE_MESSAGE_TOO_BIG = 1009  # a frame over the server's max_message_bytes
CLOSE_SERVICE_RESTART = 1012  # the server is shutting down
CLOSE_TRY_AGAIN_LATER = 1013  # the model is loading, or the server holds as many sockets as it may
CLOSE_ABNORMAL = 1006  # the connection broke without a close frame (RFC 6455)


class ClientError(Exception):
    """Base class of every error `typewriter.client` raises. `code` names what went wrong."""

    code = "client"


class ChatError(ClientError):
    """An `error` frame: the server refused a frame or a chat failed. The connection stays usable."""

    def __init__(self, code: str, message: str, chat_id: str | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.chat_id = code, message, chat_id


class ServerClosed(ClientError):
    """The server closed the connection (or it broke: close code 1006). Open a new client to go on;
    with `retry=`, a chat that met 1013 before it got an answer reconnects by itself."""

    code = "closed"

    def __init__(self, close_code: int, reason: str = ""):
        super().__init__(f"the server closed the connection with {close_code}" + (f": {reason}" if reason else ""))
        self.close_code, self.reason = close_code, reason


class ConnectFailed(ClientError):
    """The socket at `url` could not be opened (no listener, no such host, a timeout, TLS); `reason` says which."""

    code = "connect_failed"

    def __init__(self, url: str, reason: str):
        super().__init__(f"cannot connect to {url}: {reason}")
        self.url, self.reason = url, reason


class HandshakeRefused(ClientError):
    """The server refused to open the socket with an HTTP status: 401 (a missing or wrong API key, code
    `unauthorized`), 403 (an origin it does not allow), 400 (a host name it does not answer to)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"the server refused the connection with HTTP {status}: {message}")
        self.status, self.code, self.message = status, code, message


class ChatTimeout(ClientError, TimeoutError):
    """No frame arrived within the client's `timeout`; the connection is closed, which cancels the chat."""

    code = "timeout"
