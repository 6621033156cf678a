from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClientMessage(_message.Message):
    __slots__ = ("chat", "stop")
    CHAT_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    chat: ChatRequest
    stop: StopRequest
    def __init__(self, chat: _Optional[_Union[ChatRequest, _Mapping]] = ..., stop: _Optional[_Union[StopRequest, _Mapping]] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("id", "messages", "params", "response_format", "tools", "tool_choice")
    ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    id: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    params: Params
    response_format: ResponseFormat
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: str
    def __init__(self, id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., params: _Optional[_Union[Params, _Mapping]] = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ("type", "name", "schema_json", "strict", "regex", "grammar")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    type: str
    name: str
    schema_json: str
    strict: bool
    regex: str
    grammar: str
    def __init__(self, type: _Optional[str] = ..., name: _Optional[str] = ..., schema_json: _Optional[str] = ..., strict: _Optional[bool] = ..., regex: _Optional[str] = ..., grammar: _Optional[str] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class Params(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop", "loop_guard")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    LOOP_GUARD_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    loop_guard: bool
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., loop_guard: _Optional[bool] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ServerEvent(_message.Message):
    __slots__ = ("id", "queued", "start", "token", "end", "tool_call")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    id: str
    queued: Queued
    start: Start
    token: Token
    end: End
    tool_call: ToolCall
    def __init__(self, id: _Optional[str] = ..., queued: _Optional[_Union[Queued, _Mapping]] = ..., start: _Optional[_Union[Start, _Mapping]] = ..., token: _Optional[_Union[Token, _Mapping]] = ..., end: _Optional[_Union[End, _Mapping]] = ..., tool_call: _Optional[_Union[ToolCall, _Mapping]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("index", "call_id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    call_id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class Queued(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: int
    def __init__(self, position: _Optional[int] = ...) -> None: ...

class Start(_message.Message):
    __slots__ = ("prompt_tokens", "cached_tokens", "dropped_messages")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_tokens: int
    dropped_messages: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., dropped_messages: _Optional[int] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("index", "text")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class End(_message.Message):
    __slots__ = ("reason", "usage", "timings")
    REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    usage: Usage
    timings: Timings
    def __init__(self, reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "ttft_ms", "total_ms", "tokens_per_s")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    ttft_ms: float
    total_ms: float
    tokens_per_s: float
    def __init__(self, queue_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., tokens_per_s: _Optional[float] = ...) -> None: ...
