"""A Python client for Typewriter's protocol v1 (docs/protocol.md, docs/client.md). It needs only `websockets`;
importing it loads neither TensorFlow nor the server.

    from typewriter.client import Client

    client = Client("http://127.0.0.1:8000")  # api_key=..., timeout=..., retry=True
    for delta in client.chat("What is a prime number?", max_new_tokens=200, temperature=0):
        print(delta, end="", flush=True)
    talk = client.conversation()  # keeps the history: talk.say("Is 91 prime?").result().text

The async API is the same with `await` (`AsyncClient`). Every error it raises is a ClientError (errors.py).
"""

from .aio import AsyncChat, AsyncClient, AsyncConversation
from .errors import ChatError, ChatTimeout, ClientError, ConnectFailed, HandshakeRefused, ServerClosed
from .events import Ended, Event, Queued, Result, Started, Timings, TokenEvent, ToolCallEvent, Usage
from .protocol import DEFAULT_URL, Params, Retry, ws_url
from .sync import Chat, Client, Conversation

__all__ = [
    "DEFAULT_URL",
    "AsyncChat",
    "AsyncClient",
    "AsyncConversation",
    "Chat",
    "ChatError",
    "ChatTimeout",
    "Client",
    "ClientError",
    "ConnectFailed",
    "Conversation",
    "Ended",
    "Event",
    "HandshakeRefused",
    "Params",
    "Queued",
    "Result",
    "Retry",
    "ServerClosed",
    "Started",
    "Timings",
    "TokenEvent",
    "ToolCallEvent",
    "Usage",
    "ws_url",
]
