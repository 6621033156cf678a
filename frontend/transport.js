// @ts-check
/**
 * The WebSocket transport. One long-lived socket, reopened with exponential backoff when it drops, and one
 * async generator, `chat`, that sends a chat frame and yields that chat's server messages.
 *
 * Contract of `chat`: it yields zero or more `queued`/`start`/`token` messages and then exactly one terminal
 * message (`end` or `error`), like the protocol itself. Two terminals are made here rather than by the
 * server: `error` with code `disconnected` when the socket drops mid-answer, and `end` with reason
 * `cancelled` when the signal aborts before the request was sent (a `resume` is sent all the same, then `stop`).
 * Aborting after it was sent sends `stop` and keeps yielding until the server's `end`. Chats run one at a time (the server answers `busy`
 * otherwise): a new one waits for the previous terminal, which after a stop is one decode step away.
 *
 * A chat is held, not failed, while there is no socket to send it on: it goes out when one opens. The server
 * reads no frame on a socket it closes with 1013 (its model is loading, or it holds as many sockets as it
 * takes), so a chat sent on such a socket is held too and sent again on the next. While the model loads, the
 * connection asks `readyUrl` (GET /readyz) for the load's progress about once a second instead of opening
 * sockets, and opens one as soon as the server says it is ready.
 *
 * A socket can die without closing (a phone that changed networks): while a chat runs, a socket quiet for
 * `quietMs` is sent a `ping`, and one that stays quiet `pongWaitMs` longer is abandoned as if it had closed.
 * `abandon()` does the same at once (the page calls it when the browser goes offline). Carrying the answer
 * across the new socket is reconnect.js's part.
 */

import { isTerminal, parseServerMessage } from "./protocol.js";

/** @typedef {import("./protocol.js").ServerMessage} ServerMessage */
/** @typedef {import("./protocol.js").ChatFrame} ChatFrame */
/**
 * @typedef {object} ConnectionStatus
 * @property {"connecting" | "open" | "reconnecting" | "warming" | "full"} state
 * @property {number} retryInMs
 * @property {string} [progress]  while warming: how far the server's load has come, in its words
 * @property {number} [fraction]  while warming: the share of the load's current step done, 0 to 1, where it counts
 * @property {number} [leftS]  while warming: the seconds that step has left at its rate so far, where known
 */
/**
 * @typedef {object} ConnectionOptions
 * @property {typeof WebSocket} [WebSocket]
 * @property {(status: ConnectionStatus) => void} [onStatus]
 * @property {number} [baseDelayMs]  first reconnect delay; it doubles per failed attempt
 * @property {number} [maxDelayMs]
 * @property {() => number} [random] jitter source, so many pages do not reconnect in lockstep
 * @property {string | null} [readyUrl]  the server's readiness (GET /readyz), asked while its model loads
 * @property {typeof fetch} [fetch]
 * @property {number} [pollMs]  how often readyUrl is asked while the model loads
 * @property {number} [quietMs]     a running chat's socket silent this long is pinged
 * @property {number} [pongWaitMs]  and abandoned if still silent this much longer
 */
/**
 * Where one chat's messages go, and which socket it was sent on.
 * @typedef {object} Route
 * @property {WebSocket | null} socket  the socket the chat went out on; null while it waits to be sent
 * @property {boolean} answered  a message about it has come on that socket
 * @property {(msg: ServerMessage) => void} deliver
 * @property {() => void} hold  the socket closed with 1013 unanswered: send the chat again on the next one
 */

const OPEN = 1;
const CLOSE_TRY_AGAIN_LATER = 1013;

export class Connection {
  /**
   * @param {string | (() => string)} url  a function is asked at each connect (a key for the balancer may change)
   * @param {ConnectionOptions} [options]
   */
  constructor(url, options = {}) {
    const { WebSocket = globalThis.WebSocket, onStatus = () => {}, baseDelayMs = 500, maxDelayMs = 15000 } = options;
    const { random = Math.random, readyUrl = null, pollMs = 1000 } = options;
    const { fetch = (/** @type {string} */ url, /** @type {RequestInit} */ init) => globalThis.fetch(url, init) } = options;
    this.url = url;
    this.WebSocket = WebSocket;
    this.onStatus = onStatus;
    this.baseDelayMs = baseDelayMs;
    this.maxDelayMs = maxDelayMs;
    this.random = random;
    this.readyUrl = readyUrl;
    this.fetch = fetch;
    this.pollMs = pollMs;
    this.quietMs = options.quietMs ?? 5000;
    this.pongWaitMs = options.pongWaitMs ?? 5000;
    /** @type {Set<(status: ConnectionStatus) => void>} more status listeners (reconnect.js counts failures) */
    this.watchers = new Set();
    this.heardAt = 0;
    /** @type {ReturnType<typeof setInterval> | undefined} */
    this.heartbeat = undefined;
    /** @type {WebSocket | null} */
    this.socket = null;
    this.attempt = 0;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    this.retryTimer = undefined;
    /** @type {Map<string, Route>} each chat not yet ended, in the order they were asked */
    this.routes = new Map();
    /** @type {Set<() => void>} */
    this.openWaiters = new Set();
    /** @type {Promise<void>} settles when the previous chat has its terminal message */
    this.previous = Promise.resolve();
    this.closed = false;
    this.warming = false;
    /** asking readyUrl while the model loads (one loop at a time) */
    this.watching = false;
  }

  get isOpen() {
    return this.socket?.readyState === OPEN;
  }

  /**
   * Start: with a readyUrl, ask it first, so a page opened while the model loads waits for it (with its progress)
   * rather than opening a socket the server would close at once; else open the socket.
   */
  start() {
    if (this.readyUrl) this.watchLoading();
    else this.connect();
  }

  /** Open the socket now, cancelling any backoff wait. */
  connect() {
    if (this.closed || (this.socket && this.socket.readyState <= OPEN)) return;
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    this.status({ state: this.warming ? "warming" : this.attempt === 0 ? "connecting" : "reconnecting", retryInMs: 0 });
    const socket = new this.WebSocket(typeof this.url === "function" ? this.url() : this.url);
    this.socket = socket;
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.heardAt = Date.now();
      this.status({ state: "open", retryInMs: 0 });
      for (const wake of this.openWaiters) wake();
    };
    socket.onmessage = (event) => {
      this.heardAt = Date.now();
      const msg = parseServerMessage(event.data);
      if (!msg || msg.type === "pong") return;
      // Only `invalid_json` lacks an id, and it can only be about the chat in flight, the oldest one.
      const id = "id" in msg && msg.id !== null ? msg.id : [...this.routes.keys()][0];
      this.routes.get(id ?? "")?.deliver(msg);
    };
    socket.onclose = (/** @type {{code?: number, reason?: string}} */ event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      this.stopHeartbeat();
      // 1013 (try again later): the server is up but its model is still loading, or it holds as many
      // connections as it takes (in all, or from this address); its reason says which. It read nothing.
      const later = event?.code === CLOSE_TRY_AGAIN_LATER;
      for (const [id, route] of this.routes) {
        if (route.socket !== socket) continue; // not sent yet: it waits for the next socket
        route.socket = null;
        if (later && !route.answered) route.hold();
        else route.deliver({ type: "error", id, code: "disconnected", message: "the connection closed" });
      }
      if (opened && !later) this.attempt = 0; // a good connection: the backoff starts over
      this.warming = later && /loading/i.test(event?.reason ?? "");
      if (this.closed) return;
      if (this.warming && this.readyUrl) this.watchLoading();
      else this.scheduleRetry(this.warming ? "warming" : later ? "full" : "reconnecting");
    };
  }

  /**
   * While the model loads: ask readyUrl for its progress about once a second, and open the socket once the
   * server no longer says "loading" (ready, or anything a socket will say better, or no answer at all).
   * @private
   */
  async watchLoading() {
    if (this.watching) return;
    this.watching = true;
    try {
      for (;;) {
        const body = await this.readiness();
        if (this.closed || this.socket) return;
        if (body?.status !== "loading") break;
        this.warming = true;
        const progress = typeof body.progress === "string" ? body.progress : "";
        this.status({ state: "warming", retryInMs: this.pollMs, progress, ...loadEstimate(body) });
        await new Promise((resolve) => setTimeout(resolve, this.pollMs));
      }
    } finally {
      this.watching = false;
    }
    this.connect();
  }

  /**
   * The body of readyUrl, or null when it cannot be had.
   * @private
   * @returns {Promise<{status?: string, progress?: unknown, fraction?: unknown, left_s?: unknown} | null>}
   */
  async readiness() {
    try {
      const response = await this.fetch(/** @type {string} */ (this.readyUrl), { cache: "no-store" });
      const body = await response.json();
      return body && typeof body === "object" ? body : null;
    } catch {
      return null;
    }
  }

  /** Stop for good (tests, page teardown). */
  close() {
    this.closed = true;
    clearTimeout(this.retryTimer);
    this.stopHeartbeat();
    this.socket?.close();
  }

  /**
   * Give the socket up now, as if it had closed: it may be dead without knowing it (the network changed). Its
   * running chats get `disconnected` and the connection reopens with backoff.
   */
  abandon() {
    const socket = this.socket;
    if (!socket) return;
    const onclose = socket.onclose;
    socket.onclose = socket.onmessage = socket.onopen = null;
    try {
      socket.close();
    } catch {
      // a socket still connecting may refuse to close; it is dropped all the same
    }
    onclose?.call(socket, /** @type {any} */ ({ code: 1006, reason: "abandoned" }));
  }

  /** @param {ConnectionStatus} status */
  status(status) {
    this.onStatus(status);
    for (const watch of this.watchers) watch(status);
  }

  /** @private While chats run, ping a quiet socket, and abandon one that stays quiet. */
  startHeartbeat() {
    if (this.heartbeat !== undefined) return;
    let pinged = false;
    this.heartbeat = setInterval(() => {
      if (!this.isOpen || this.routes.size === 0) return;
      const quiet = Date.now() - this.heardAt;
      if (quiet < this.quietMs) pinged = false;
      else if (!pinged) pinged = this.send({ type: "ping" });
      else if (quiet >= this.quietMs + this.pongWaitMs) this.abandon();
    }, Math.max(250, Math.min(this.quietMs, this.pongWaitMs) / 4));
  }

  /** @private */
  stopHeartbeat() {
    clearInterval(this.heartbeat);
    this.heartbeat = undefined;
  }

  /**
   * @private
   * @param {"reconnecting" | "warming" | "full"} state
   */
  scheduleRetry(state) {
    const ceiling = Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** this.attempt);
    const delay = Math.round(ceiling * (0.5 + this.random() / 2));
    this.attempt++;
    this.status({ state, retryInMs: delay });
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  /**
   * Resolve once the socket is open; connects at once if it is waiting to retry, unless the model is loading
   * (then the socket opens when the server says it is ready).
   * @param {AbortSignal} [signal]
   * @returns {Promise<boolean>} false if the signal aborted first
   */
  async whenOpen(signal) {
    if (this.isOpen) return true;
    if (signal?.aborted) return false;
    if (!this.watching) this.connect();
    return new Promise((resolve) => {
      const done = (/** @type {boolean} */ ok) => {
        this.openWaiters.delete(wake);
        signal?.removeEventListener("abort", abort);
        resolve(ok);
      };
      const wake = () => done(true);
      const abort = () => done(false);
      this.openWaiters.add(wake);
      signal?.addEventListener("abort", abort, { once: true });
    });
  }

  /** @param {object} frame */
  send(frame) {
    if (!this.isOpen) return false;
    /** @type {WebSocket} */ (this.socket).send(JSON.stringify(frame));
    return true;
  }

  /**
   * Send one chat and yield its messages, ending with exactly one terminal message. The chat is held while
   * there is no socket, and sent again when a socket closed with 1013 before answering it.
   * @param {ChatFrame} frame
   * @param {AbortSignal} [signal]  abort to stop the answer
   * @returns {AsyncGenerator<ServerMessage, void, void>}
   */
  async *chat(frame, signal) {
    const id = frame.id;
    const before = this.previous;
    /** @type {() => void} */
    let release = () => {};
    this.previous = new Promise((resolve) => (release = resolve));

    /** @type {ServerMessage[]} */
    const inbox = [];
    /** @type {(() => void) | null} */
    let wake = null;
    let finished = false;
    let held = false;
    /** @type {Route} */
    const route = {
      socket: null,
      answered: false,
      deliver: (msg) => {
        route.answered = true;
        inbox.push(msg);
        if (isTerminal(msg)) {
          finished = true;
          this.routes.delete(id);
          release();
        }
        wake?.();
      },
      hold: () => {
        held = true;
        wake?.();
      },
    };
    this.routes.set(id, route);
    const stop = () => this.send({ type: "stop", id });

    // A resume goes out even once the signal has aborted, with a stop right after it: the chat it names runs on
    // the server whatever this page does, and only taking it over lets the stop reach it (reconnect.js).
    const takeOver = frame.type === "resume";
    try {
      await before;
      for (;;) {
        if ((signal?.aborted && !takeOver) || !(await this.whenOpen(takeOver ? undefined : signal))) {
          this.routes.delete(id);
          release();
          yield { type: "end", id, reason: "cancelled", usage: null, timings: null };
          return;
        }
        if (!this.send(frame)) continue; // closed in between: wait for the next socket
        route.socket = this.socket;
        held = false;
        this.heardAt = Date.now();
        this.startHeartbeat();
        if (signal?.aborted) stop();
        else signal?.addEventListener("abort", stop, { once: true });
        while (!held) {
          while (inbox.length) {
            const msg = /** @type {ServerMessage} */ (inbox.shift());
            yield msg;
            if (isTerminal(msg)) return;
          }
          if (!held) await new Promise((resolve) => (wake = () => resolve(undefined)));
          wake = null;
        }
        signal?.removeEventListener("abort", stop);
      }
    } finally {
      signal?.removeEventListener("abort", stop);
      // A consumer that leaves early still owes the server a stop for a chat it sent (the next chat waits for
      // its end); one never sent is simply dropped.
      if (!finished && route.socket) stop();
      else if (!finished) {
        this.routes.delete(id);
        release();
      }
    }
  }
}

/**
 * /readyz's estimate of a load (`fraction`, `left_s`), each kept only when it is a number that makes sense.
 * @param {{fraction?: unknown, left_s?: unknown}} body
 * @returns {{fraction?: number, leftS?: number}}
 */
export function loadEstimate({ fraction, left_s: leftS }) {
  const out = /** @type {{fraction?: number, leftS?: number}} */ ({});
  if (typeof fraction === "number" && fraction >= 0 && fraction <= 1) out.fraction = fraction;
  if (typeof leftS === "number" && Number.isFinite(leftS) && leftS >= 0) out.leftS = leftS;
  return out;
}
