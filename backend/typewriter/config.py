"""Settings: frozen dataclasses in groups (serving, model, engine, answers, socket, resume, limits, access,
identity), read once from the environment, passed down explicitly.

This is the only module that reads the environment, and it imports nothing of the package: everything may read
the settings. Every field `name` can be set as `TYPEWRITER_<NAME>` (for example `TYPEWRITER_MAX_ACTIVE=8`);
command-line options arrive as keyword overrides and win.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath

ENV_PREFIX = "TYPEWRITER_"
XLA_CACHE_VAR = "TYPEWRITER_XLA_CACHE"  # read by xla_cache_dir, before TensorFlow loads
LITE_CACHE_VAR = "TYPEWRITER_LITE_CACHE"  # read by lite_cache_dir
# Read by clients (the notebook, examples/), not by the server; a shell that sets them may still start one.
CLIENT_VARS = ("TYPEWRITER_URL",)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
CLIENT_SYSTEM_PROMPT = ("refuse", "append", "replace")  # see Answers.client_system_prompt, api_system_prompt
EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"  # the id of the model shipped with the package (weights/source.py)
MODEL_ID = re.compile(r"[^\s\x00-\x1f\x7f]{1,128}")  # printable, no spaces
BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


MAX_READING_S = 3600.0  # the longest Engine.keep_for_readers_s
# The most tokens a step guesses for one answer and checks (engine/drafting.py): with the row they follow, blocks.c's
# AVX-512 row tile, beyond which a row costs a pass over the weights more (docs/measurements/2026-12-06-drafts.md).
MOST_DRAFT_TOKENS = 5
DEFAULT_MAX_NEW_TOKENS = 512  # an answer's length when a chat does not ask (at most the cap, below)


# How a model's matrices are held and run (`--weights`): runners/lite/ runs the int8-lite formats, runners/xla/ the others.
class WeightFormat(enum.StrEnum):
    # Llama-family models: q4-blocks where its kernel runs on AVX-512 VNNI, else int8-lite; fp32 for the others
    AUTO = "auto"
    FP32 = "fp32"  # XLA: the file's weights exactly
    INT8 = "int8"  # XLA: int8 x int8 after a rotation (runners/xla/quantized.py)
    # LiteRT programs: int8 weights rounded by GPTQ, the rows that need it at 16 bits; -fast keeps every row at 8
    # bits, faster for a larger KL from fp32 (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
    INT8_LITE = "int8-lite"
    INT8_LITE_FAST = "int8-lite-fast"
    # No programs: every step runs the GGUF file's own 4-bit and 8-bit blocks in a C kernel, a step's layers in one
    # call, the model held once in about the file's bytes (docs/measurements/2026-12-05-gguf-blocks-kernel.md,
    # docs/measurements/2026-12-06-q4-blocks-alone.md).
    Q4_BLOCKS = "q4-blocks"

    @property
    def lite(self) -> bool:
        """Run by the lite runtime: int8-lite's programs on LiteRT, or q4-blocks' kernel (else by XLA)."""
        return self in (WeightFormat.INT8_LITE, WeightFormat.INT8_LITE_FAST, WeightFormat.Q4_BLOCKS)

    def resolved(self, family: str, wide_blocks: bool) -> WeightFormat:
        """AUTO made concrete for a model `family` on this machine (`wide_blocks`: q4-blocks would run on AVX-512
        VNNI, runners/lite/kernel.py's blocks_run_wide); any other format as it is. There q4-blocks beats int8-lite
        on one student, a class, the start, the memory and the KL (docs/measurements/2026-12-06-zen4.md)."""
        if self is not WeightFormat.AUTO:
            return self
        if family != "llama":
            return WeightFormat.FP32
        return WeightFormat.Q4_BLOCKS if wide_blocks else WeightFormat.INT8_LITE


WEIGHT_FORMATS = tuple(f.value for f in WeightFormat)


class ConfigError(ValueError):
    """A setting has a value that cannot be used. The message names where the value came from (`source`: the
    variable by default, or the command-line option a command read it from) and what it accepts."""

    def __init__(self, setting: str | None, problem: str, source: str | None = None):
        self.setting, self.problem = setting, problem
        where = source or (_env(setting) if setting else None)
        super().__init__(f"{where}: {problem}" if where else problem)

    def given_as(self, source: str) -> ConfigError:
        """The same error, naming `source` (such as `--port`) as where the value came from."""
        return ConfigError(self.setting, self.problem, source)


@dataclass(frozen=True)
class Serving:
    """Where the process listens and how it stops."""

    host: str = "127.0.0.1"
    port: int = 8000
    # gRPC (typewriter.v1.Chat, with health and reflection) beside the HTTP server, in the same process and engine:
    # None is off, 0 picks a free port. It listens on `host` too.
    grpc_port: int | None = None
    # After SIGTERM or SIGINT: running answers may go on for drain_s (docker stop waits 10 s by default), then
    # every chat still running ends with reason `shutdown`, and the server waits shutdown_grace_s for their `end`.
    drain_s: float = 8.0
    shutdown_grace_s: float = 5.0
    log_level: str = "info"

    def __post_init__(self) -> None:
        for name in ("port", "grpc_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(name, f"must be a port from 0 to 65535 (0 picks a free one), got {port}")
        if self.grpc_port and self.grpc_port == self.port:
            raise ConfigError("grpc_port", f"must differ from the HTTP port ({self.port}), got {self.grpc_port}")
        _at_least("drain_s", self.drain_s, 0.0)
        _at_least("shutdown_grace_s", self.shutdown_grace_s, 0.0)
        _one_of("log_level", self.log_level, LOG_LEVELS)


@dataclass(frozen=True)
class Model:
    """What is served."""

    model_path: str | None = None  # None: the embedded model
    # The model's name to clients: /v1/models, the `model` of OpenAI responses, /readyz, the page and the log.
    # None: default_model_id(model_path), a name without spaces that stays the same across restarts.
    model_id: str | None = None
    # How the matrices are held and run: int8-lite has nothing to compile, so it is ready sooner, with faster steps
    # and a smaller footprint than fp32 (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
    weights: WeightFormat = WeightFormat.AUTO

    def __post_init__(self) -> None:
        if self.model_id is None:
            object.__setattr__(self, "model_id", default_model_id(self.model_path))
        elif not MODEL_ID.fullmatch(self.model_id):
            raise ConfigError("model_id", f"must be 1 to 128 characters without spaces (such as SmolLM2-135M-Instruct),"
                                          f" got {self.model_id!r}")
        _one_of("weights", self.weights, WEIGHT_FORMATS)
        object.__setattr__(self, "weights", WeightFormat(self.weights))

    @property
    def id(self) -> str:
        assert self.model_id is not None  # made in __post_init__
        return self.model_id


@dataclass(frozen=True)
class Engine:
    """The engine: slots decoded together, the bounded wait queue, each slot's context, and the deadlines."""

    # More slots give more students at once, each stream slower; None: as many as this machine carries under the
    # capacity bar, sized at start from measured step times (engine/capacity.py; int8-lite), or XLA's fixed count.
    max_active: int | None = None
    max_queue: int = 32
    max_context: int = 2048
    # Prompt tokens prefilled per step while answers stream, per request starting; within it chunks are sized by
    # measured step times (engine/step_cost.py), so it mostly caps short-context chunks.
    prefill_budget: int = 16
    # An answer ends with `timeout` this long after it got its slot, and a chat that waited this long for a slot
    # ends with `queue_timeout` (None: no deadline). The answer's leaves the longest answer room at a slow stream's
    # speed, the queue's room for a full queue behind the slots to move.
    request_timeout_s: float | None = 300.0
    queue_timeout_s: float | None = 120.0
    # How long a client whose answer ended (a student reading it) still counts for a slot in the fair shares: a
    # client over its share takes a free slot only beyond those kept. On a CPU every row slows the step, so one
    # student's eight chats filling the slots its classmates left while reading cost them a fifth of their speed
    # (docs/measurements/2026-12-05-fairness.md). 0: only clients with a request in the engine count
    # (work-conserving). A lone client is never held back: nobody else is kept.
    keep_for_readers_s: float = 30.0
    # Where an answer decodes alone (a step bound by memory, not arithmetic), the tokens its last few tokens were
    # followed by earlier in its conversation are checked as a draft in the same step: those that match are the
    # answer's for a fraction of a step each, the same tokens as without drafts, on q4-blocks (its rows are exact
    # whatever shares their step). The most guessed a step, 0 to MOST_DRAFT_TOKENS; 0: never.
    draft_tokens: int = MOST_DRAFT_TOKENS

    def __post_init__(self) -> None:
        if self.max_active is not None:
            _at_least("max_active", self.max_active, 1)
        _at_least("max_queue", self.max_queue, 0)
        _at_least("max_context", self.max_context, 16)
        _at_least("prefill_budget", self.prefill_budget, 1)
        _at_least("keep_for_readers_s", self.keep_for_readers_s, 0.0)
        _at_least("draft_tokens", self.draft_tokens, 0)
        if self.draft_tokens > MOST_DRAFT_TOKENS:
            raise ConfigError("draft_tokens", f"must be at most {MOST_DRAFT_TOKENS}, got {self.draft_tokens}")
        if self.keep_for_readers_s > MAX_READING_S:  # each kept reader is remembered: an hour bounds how many
            raise ConfigError("keep_for_readers_s", f"must be at most {MAX_READING_S}, got {self.keep_for_readers_s}")
        for name in ("request_timeout_s", "queue_timeout_s"):
            _positive_or_none(name, getattr(self, name))


@dataclass(frozen=True)
class Answers:
    """What every answer gets: its length and the tutor's instructions."""

    # The default answer length when a chat does not ask, and the most it may ask for. None: from max_context (the
    # cap at most half of it, the default at most the cap); Settings fills them in.
    max_new_tokens: int | None = None
    max_new_tokens_cap: int | None = None
    system_prompt: str | None = None  # None: the tutor's default (tokenizer.DEFAULT_SYSTEM_PROMPT); "": none
    # A chat on the socket (the page's door) that brings its own system message: "refuse" it (error
    # system_prompt_not_allowed), "append" it after the server's system prompt, or let it "replace" the server's.
    # Refused by default: the tutor's instructions are the school's, not the page's.
    client_system_prompt: str = "refuse"
    # The same on /v1 and gRPC, whose clients are programs that mostly send a system message of their own: by
    # default it follows the server's, which stays first, so the prefix cache still shares the server's.
    api_system_prompt: str = "append"
    # Offer the tutor the server's own calculator (server/calculator.py) where the model's template takes tools: a
    # socket chat, or a /v1 request without tools of its own. Off: the 0.5B and the 1.5B never called it on maths
    # problems, and its tools section made their answers slower (docs/measurements/2026-12-05-calculator.md).
    calculator: bool = False
    # A chat's repetition penalty when it names none. None: its model's (1.1 under 0.3B weights, where a small
    # model loops without it; 1 above, where it cost right answers: engine.request.default_repetition_penalty).
    repetition_penalty: float | None = None

    def __post_init__(self) -> None:
        if self.repetition_penalty is not None and not 0 < self.repetition_penalty <= 10:
            raise ConfigError("repetition_penalty", f"must be greater than 0 and at most 10 (1 is off, or none for "
                                                    f"the model's), got {self.repetition_penalty}")
        _one_of("client_system_prompt", self.client_system_prompt, CLIENT_SYSTEM_PROMPT)
        _one_of("api_system_prompt", self.api_system_prompt, CLIENT_SYSTEM_PROMPT)

    @property
    def default_length(self) -> int:
        assert self.max_new_tokens is not None  # filled in by Settings
        return self.max_new_tokens

    @property
    def length_cap(self) -> int:
        assert self.max_new_tokens_cap is not None  # filled in by Settings
        return self.max_new_tokens_cap


@dataclass(frozen=True)
class Socket:
    """The WebSocket: the largest frame a client may send, messages per chat, how many events may wait for a
    client that is not reading before its chat is cancelled, and pings."""

    max_message_bytes: int = 256 * 1024
    max_messages: int = 128
    send_backlog: int = 256
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        _at_least("max_message_bytes", self.max_message_bytes, 1024)
        _at_least("max_messages", self.max_messages, 1)
        _at_least("send_backlog", self.send_backlog, 1)
        _at_least("ping_interval_s", self.ping_interval_s, 0.0)
        _at_least("ping_timeout_s", self.ping_timeout_s, 0.0)


@dataclass(frozen=True)
class Resume:
    """Answers that outlive their connection (server/resume/registry.py)."""

    # A resumable chat whose client went away keeps running, its frames kept, this long for the client to come
    # back, enough for a phone to change networks; then it is cancelled and its slot freed. 0: a closed socket
    # cancels its chat at once. Its frames are bounded per chat, above the longest answer's, and in total.
    resume_grace_s: float = 60.0
    resume_buffer_bytes: int = 256 * 1024
    resume_buffer_client_bytes: int = 8 * 1024 * 1024  # one client's share, at most the total
    resume_buffer_total_bytes: int = 64 * 1024 * 1024
    # An SSE stream that has sent nothing this long (queued, prefilling) gets a comment, so a proxy's idle timeout
    # (nginx's 60 s default, cloud balancers') never cuts it; None: never.
    sse_keepalive_s: float | None = 15.0

    def __post_init__(self) -> None:
        _at_least("resume_grace_s", self.resume_grace_s, 0.0)
        _at_least("resume_buffer_bytes", self.resume_buffer_bytes, 4096)
        _at_least("resume_buffer_client_bytes", self.resume_buffer_client_bytes, self.resume_buffer_bytes)
        _at_least("resume_buffer_total_bytes", self.resume_buffer_total_bytes, self.resume_buffer_bytes)
        _positive_or_none("sse_keepalive_s", self.sse_keepalive_s)


@dataclass(frozen=True)
class Limits:
    """Abuse limits for a public server (server/limits.py, server/connections.py)."""

    # Sockets in total and per client address, chats a minute per address. The address is the socket's peer, or
    # X-Forwarded-For when that peer is one of trusted_proxies (a comma-separated list of IP addresses; "" trusts
    # none, so the header is ignored).
    max_connections: int = 512
    max_connections_per_client: int = 64  # a whole class behind one school's NAT shares an address
    chats_per_minute: int = 120  # per address, so also per class behind a NAT
    # The per-address caps above for whole ranges, "CIDR=N,...": an address in the range may hold N connections
    # and N chats at once, and its chats a minute grow by as much, so a school raises them for its own network
    # while each student's limits (below) still hold. The first range that holds an address counts.
    address_caps: str = ""
    # One client's (a student, an API key, or an address with neither): chats a minute and chats at once, kept
    # ones and each of n choices included. None: the per-address figure, so without classes nothing changes; a
    # class in the classes file may set its own.
    student_chats_per_minute: int | None = None
    student_chats_at_once: int | None = None
    frames_per_second: int = 20  # per socket, in bursts of up to twice that; past it the socket is closed (1008)
    trusted_proxies: str = ""
    # Connections that have not sent a whole request header yet: each has header_timeout_s to send one (and a POST
    # its body), and at most max_pending_per_client from one address and max_pending_connections in all may wait;
    # past a cap the oldest waiting is closed, so a new one gets its turn.
    header_timeout_s: float = 10.0
    max_pending_connections: int = 256
    max_pending_per_client: int = 64

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_client", "chats_per_minute", "frames_per_second",
                     "max_pending_connections", "max_pending_per_client"):
            _at_least(name, getattr(self, name), 1)
        if self.student_chats_per_minute is None:
            object.__setattr__(self, "student_chats_per_minute", self.chats_per_minute)
        if self.student_chats_at_once is None:
            object.__setattr__(self, "student_chats_at_once", self.max_connections_per_client)
        _at_least("student_chats_per_minute", self.chats_per_student, 1)
        _at_least("student_chats_at_once", self.at_once_per_student, 1)
        try:
            parse_address_caps(self.address_caps)
        except ValueError as e:
            raise ConfigError("address_caps", f"{e}; give ranges like 10.20.0.0/16=640, separated by commas") \
                from None
        try:
            parse_proxies(self.trusted_proxies)
        except ValueError as e:
            raise ConfigError("trusted_proxies", f"{e}; give IP addresses separated by commas") from None
        if self.header_timeout_s <= 0:
            raise ConfigError("header_timeout_s", f"must be greater than 0, got {self.header_timeout_s}")

    @property
    def chats_per_student(self) -> int:
        assert self.student_chats_per_minute is not None  # filled in by __post_init__
        return self.student_chats_per_minute

    @property
    def at_once_per_student(self) -> int:
        assert self.student_chats_at_once is not None  # filled in by __post_init__
        return self.student_chats_at_once


@dataclass(frozen=True)
class Identity:
    """Who a student is (server/identity.py) and the classes they belong to (server/classes.py)."""

    # A TOML file of classes: each a name, an API key and/or a join code, a weight, the tutor's instructions and
    # limits (docs/configuration.md). None: one default class, as the server's own settings say.
    classes: str | None = None
    # The key that signs the page's student cookies; "": a random one made at start, so a restart (or another
    # replica) issues new identities. At least 32 characters; replicas behind one balancer share it.
    identity_secret: str = ""
    # New student identities (cookies) one address may be issued a minute; past it, pages are served without one
    # and their chats count as the address's. Grows with the address's range in address_caps.
    identities_per_minute: int = 60

    def __post_init__(self) -> None:
        if self.classes is not None and not self.classes.strip():
            raise ConfigError("classes", "must be the path of a classes file (TOML), or none")
        if self.identity_secret and len(self.identity_secret) < 32:
            raise ConfigError("identity_secret", f"must be at least 32 characters (or empty, for a random one), "
                                                 f"got {len(self.identity_secret)}")
        _at_least("identities_per_minute", self.identities_per_minute, 1)


@dataclass(frozen=True)
class Access:
    """Who may reach the server (server/origins.py, server/auth.py)."""

    # Names the server answers to (the Host header; comma-separated, * for any; "": the loopback names and the
    # listening address) and pages that may open the socket (Origin; comma-separated like https://tutor.school.org;
    # "": the page's own origin): together they stop DNS rebinding and other sites' pages.
    allowed_hosts: str = ""
    allowed_origins: str = ""
    # With an api_key, the socket and every HTTP route but /healthz and /readyz need `Authorization: Bearer <key>`;
    # api_key_page lets the page, its files and sockets from an allowed origin in without it.
    api_key: str = ""
    api_key_page: bool = False

    def __post_init__(self) -> None:
        for name in parse_list(self.allowed_hosts):
            if "*" in name and name != "*" and not (name.startswith("*.") and "*" not in name[2:]):
                raise ConfigError("allowed_hosts", f"{name!r}: a wildcard must be * alone or lead a domain, like "
                                                   "*.school.org")


GROUPS = {"serving": Serving, "model": Model, "engine": Engine, "answers": Answers, "socket": Socket,
          "resume": Resume, "limits": Limits, "access": Access, "identity": Identity}


@dataclass(frozen=True)
class Settings:
    """Every setting, in groups. A field `name` of any group is set as `TYPEWRITER_<NAME>`; names are unique
    across groups, so `Settings.of(max_active=8)` needs no group."""

    serving: Serving = dataclasses.field(default_factory=Serving)
    model: Model = dataclasses.field(default_factory=Model)
    engine: Engine = dataclasses.field(default_factory=Engine)
    answers: Answers = dataclasses.field(default_factory=Answers)
    socket: Socket = dataclasses.field(default_factory=Socket)
    resume: Resume = dataclasses.field(default_factory=Resume)
    limits: Limits = dataclasses.field(default_factory=Limits)
    access: Access = dataclasses.field(default_factory=Access)
    identity: Identity = dataclasses.field(default_factory=Identity)

    def __post_init__(self) -> None:
        answers, context = self.answers, self.engine.max_context
        cap = answers.max_new_tokens_cap
        cap = max(1, min(1024, context // 2)) if cap is None else cap
        length = min(DEFAULT_MAX_NEW_TOKENS, cap) if answers.max_new_tokens is None else answers.max_new_tokens
        _at_least("max_new_tokens", length, 1)
        _at_least("max_new_tokens_cap", cap, length)
        if cap >= context:
            raise ConfigError("max_new_tokens_cap", f"must be smaller than max_context ({context}) so a prompt "
                                                    f"still fits, got {cap}")
        object.__setattr__(self, "answers", dataclasses.replace(answers, max_new_tokens=length,
                                                                 max_new_tokens_cap=cap))

    @classmethod
    def of(cls, **values: object) -> Settings:
        """Settings from flat field names (`max_active=8`), each put in its group; the rest are defaults."""
        where = _fields()
        unknown = sorted(k for k in values if k not in where)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(unknown)}")
        grouped: dict[str, dict[str, object]] = {group: {} for group in GROUPS}
        for name, value in values.items():
            grouped[where[name]][name] = value
        return cls(**{group: GROUPS[group](**fields) for group, fields in grouped.items()})

    def flat(self) -> dict[str, object]:
        """Every field by its flat name (`Settings.of(**s.flat())` is `s`)."""
        return {f.name: getattr(getattr(self, group), f.name)
                for group, kind in GROUPS.items() for f in dataclasses.fields(kind)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **overrides: object) -> Settings:
        """Settings from `TYPEWRITER_*` variables, then `overrides` (None means "not given" and is ignored)."""
        where = _fields()
        unknown = sorted(k for k in overrides if k not in where)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(unknown)}")
        known_vars = {_env(name) for name in where} | {XLA_CACHE_VAR, LITE_CACHE_VAR, *CLIENT_VARS}
        stray = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known_vars)
        if stray:
            raise ConfigError(None, f"{stray[0]}: not a setting; known: {', '.join(sorted(known_vars))}")
        values: dict[str, object] = {}
        for name, group in where.items():
            raw = environ.get(_env(name))
            if raw is not None:
                values[name] = _parse(name, raw, typing.get_type_hints(GROUPS[group])[name])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.of(**values)


def _fields() -> dict[str, str]:
    """Each field's flat name -> its group's."""
    return {f.name: group for group, kind in GROUPS.items() for f in dataclasses.fields(kind)}


def _env(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _at_least(name: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(name, f"must be at least {low}, got {value}")


def _positive_or_none(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(name, f"must be greater than 0 (or none), got {value}")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, f"must be one of {', '.join(allowed)}, got {value!r}")


def _parse(name: str, raw: str, hint: object) -> object:
    optional = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    kind: typing.Any = next(t for t in typing.get_args(hint) if t is not type(None)) if optional else hint
    text = raw.strip()
    if optional and (text.lower() == "none" or (not text and kind is not str)):
        return None  # unset; an empty text setting stays "" (TYPEWRITER_SYSTEM_PROMPT="": no system prompt)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return text.lower()  # checked against the members by its group
    if kind is str:
        return text.lower() if name == "log_level" else raw
    if kind is bool:
        if text.lower() in BOOLEANS:
            return BOOLEANS[text.lower()]
        raise ConfigError(name, f"must be true or false, got {raw!r}")
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or (kind is float and not math.isfinite(value)):
        noun = "an integer" if kind is int else "a finite number"
        blank = " or 'none'" if optional else ""
        raise ConfigError(name, f"must be {noun}{blank}, got {raw!r}")
    return value


def parse_proxies(spec: str) -> frozenset[str]:
    """`trusted_proxies`: a comma-separated list of IP addresses; "" trusts none."""
    out = set()
    for item in (p.strip() for p in spec.split(",")):
        if item:
            try:
                out.add(str(ipaddress.ip_address(item)))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address") from None
    return frozenset(out)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_address_caps(spec: str) -> tuple[tuple[Network, int], ...]:
    """`address_caps`: "CIDR=N" items separated by commas, in the order they are tried."""
    out = []
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        network, equals, cap = item.partition("=")
        try:
            parsed = ipaddress.ip_network(network.strip(), strict=False)
        except ValueError:
            raise ValueError(f"{item!r}: {network.strip()!r} is not an address range (CIDR)") from None
        if not equals or not cap.strip().isdigit() or int(cap) < 1:
            raise ValueError(f"{item!r}: the cap after = must be a whole number from 1")
        out.append((parsed, int(cap)))
    return tuple(out)


def parse_list(spec: str) -> tuple[str, ...]:
    """`allowed_hosts`, `allowed_origins`: a comma-separated list, lowercased."""
    return tuple(item.strip().lower() for item in spec.split(",") if item.strip())


def default_model_id(model_path: str | None) -> str:
    """From the file's or folder's name (`~/models/Qwen2.5 0.5B.gguf` -> `Qwen2.5-0.5B`), never from inside the
    file: a GGUF's `general.name` is often a training run's label."""
    if not model_path:
        return EMBEDDED_MODEL_ID
    name = PurePath(os.path.abspath(os.path.expanduser(model_path))).name
    name = name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    return "-".join(name.split())[:128] or "model"


def xla_cache_dir(environ: Mapping[str, str] = os.environ) -> str | None:
    """`TYPEWRITER_XLA_CACHE`, by default in the user's cache folder; None when off. Read before TensorFlow loads,
    so it is not a Settings field."""
    return _cache_dir(XLA_CACHE_VAR, "xla", environ)


def lite_cache_dir(environ: Mapping[str, str] = os.environ) -> str | None:
    """`TYPEWRITER_LITE_CACHE`, by default in the user's cache folder; None when off. Every command that loads a
    model uses it, so it is not a Settings field."""
    return _cache_dir(LITE_CACHE_VAR, "lite", environ)


def _cache_dir(var: str, name: str, environ: Mapping[str, str]) -> str | None:
    if var not in environ:
        base = environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "typewriter", name)
    cache = environ[var].strip()
    if not cache or cache.lower() in ("none", "off"):
        return None
    return os.path.expanduser(cache)
