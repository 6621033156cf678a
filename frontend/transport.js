// @ts-check
/**
 * The WebSocket transport. One long-lived socket, reopened with exponential backoff when it drops, and one
 * async generator, `chat`, that sends a chat frame and yields that chat's server messages.
 *
 * Contract of `chat`: it yields zero or more `queued`/`start`/`token` messages and then exactly one terminal
 * message (`end` or `error`), like the protocol itself. Two terminals are made here rather than by the
 * server: `error` with code `disconnected` when the socket drops mid-answer, and `end` with reason
 * `cancelled` when the signal aborts before the request was sent. Aborting after it was sent sends `stop`
 * and keeps yielding until the server's `end`. Chats run one at a time (the server answers `busy`
 * otherwise): a new one waits for the previous terminal, which after a stop is one decode step away.
 *
 * A socket can die without closing (a phone that changed networks): while a chat runs, a socket quiet for
 * `quietMs` is sent a `ping`, and one that stays quiet `pongWaitMs` longer is abandoned as if it had closed.
 * `abandon()` does the same at once (the page calls it when the browser goes offline). Carrying the answer
 * across the new socket is reconnect.js's part.
 */

import { isTerminal, parseServerMessage } from "./protocol.js";

/** @typedef {import("./protocol.js").ServerMessage} ServerMessage */
/** @typedef {import("./protocol.js").ChatFrame} ChatFrame */
/** @typedef {{state: "connecting" | "open" | "reconnecting" | "warming" | "full", retryInMs: number}} ConnectionStatus */
/**
 * @typedef {object} ConnectionOptions
 * @property {typeof WebSocket} [WebSocket]
 * @property {(status: ConnectionStatus) => void} [onStatus]
 * @property {number} [baseDelayMs]  first reconnect delay; it doubles per failed attempt
 * @property {number} [maxDelayMs]
 * @property {() => number} [random] jitter source, so many pages do not reconnect in lockstep
 * @property {number} [quietMs]     a running chat's socket silent this long is pinged
 * @property {number} [pongWaitMs]  and abandoned if still silent this much longer
 */

const OPEN = 1;
const CLOSE_TRY_AGAIN_LATER = 1013;

export class Connection {
  /**
   * @param {string | (() => string)} url  a function is asked at each connect (a key for the balancer may change)
   * @param {ConnectionOptions} [options]
   */
  constructor(url, { WebSocket = globalThis.WebSocket, onStatus = () => {}, baseDelayMs = 500, maxDelayMs = 15000, random = Math.random, quietMs = 5000, pongWaitMs = 5000 } = {}) {
    this.url = url;
    this.quietMs = quietMs;
    this.pongWaitMs = pongWaitMs;
    /** @type {Set<(status: ConnectionStatus) => void>} more status listeners (reconnect.js counts failures) */
    this.watchers = new Set();
    this.heardAt = 0;
    /** @type {ReturnType<typeof setInterval> | undefined} */
    this.heartbeat = undefined;
    this.WebSocket = WebSocket;
    this.onStatus = onStatus;
    this.baseDelayMs = baseDelayMs;
    this.maxDelayMs = maxDelayMs;
    this.random = random;
    /** @type {WebSocket | null} */
    this.socket = null;
    this.attempt = 0;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    this.retryTimer = undefined;
    /** @type {Map<string, (msg: ServerMessage) => void>} where each running chat's messages go */
    this.routes = new Map();
    /** @type {Set<() => void>} */
    this.openWaiters = new Set();
    /** @type {Promise<void>} settles when the previous chat has its terminal message */
    this.previous = Promise.resolve();
    this.closed = false;
    this.warming = false;
  }

  get isOpen() {
    return this.socket?.readyState === OPEN;
  }

  /** Open the socket now, cancelling any backoff wait. */
  connect() {
    if (this.closed || (this.socket && this.socket.readyState <= OPEN)) return;
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    this.status({ state: this.attempt === 0 ? "connecting" : this.warming ? "warming" : "reconnecting", retryInMs: 0 });
    const socket = new this.WebSocket(typeof this.url === "function" ? this.url() : this.url);
    this.socket = socket;
    socket.onopen = () => {
      this.attempt = 0;
      this.warming = false;
      this.heardAt = Date.now();
      this.status({ state: "open", retryInMs: 0 });
      for (const wake of this.openWaiters) wake();
    };
    socket.onmessage = (event) => {
      this.heardAt = Date.now();
      const msg = parseServerMessage(event.data);
      if (!msg || msg.type === "pong") return;
      // Only `invalid_json` lacks an id, and it can only be about the chat in flight.
      const id = "id" in msg && msg.id !== null ? msg.id : [...this.routes.keys()][0];
      this.routes.get(id ?? "")?.(msg);
    };
    socket.onclose = (/** @type {{code?: number, reason?: string}} */ event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      this.stopHeartbeat();
      for (const [id, deliver] of this.routes) {
        deliver({ type: "error", id, code: "disconnected", message: "the connection closed" });
      }
      // 1013 (try again later): the server is up but its model is still loading, or it holds as many
      // connections as it takes (in all, or from this address); its reason says which.
      const later = event?.code === CLOSE_TRY_AGAIN_LATER;
      this.warming = later && /loading/i.test(event?.reason ?? "");
      if (!this.closed) this.scheduleRetry(this.warming ? "warming" : later ? "full" : "reconnecting");
    };
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
   * Resolve once the socket is open; connects at once if it is waiting to retry.
   * @param {AbortSignal} [signal]
   * @returns {Promise<boolean>} false if the signal aborted first
   */
  async whenOpen(signal) {
    if (this.isOpen) return true;
    if (signal?.aborted) return false;
    this.connect();
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
   * Send one chat and yield its messages, ending with exactly one terminal message.
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
    this.routes.set(id, (msg) => {
      inbox.push(msg);
      if (isTerminal(msg)) {
        finished = true;
        this.routes.delete(id);
        release();
      }
      wake?.();
    });
    const stop = () => this.send({ type: "stop", id });

    try {
      await before;
      if (signal?.aborted || !(await this.whenOpen(signal)) || !this.send(frame)) {
        this.routes.delete(id);
        release();
        const cancelled = signal?.aborted ?? false;
        yield cancelled
          ? { type: "end", id, reason: "cancelled", usage: null, timings: null }
          : { type: "error", id, code: "disconnected", message: "the connection closed" };
        return;
      }
      signal?.addEventListener("abort", stop, { once: true });
      this.heardAt = Date.now();
      this.startHeartbeat();
      for (;;) {
        while (inbox.length) {
          const msg = /** @type {ServerMessage} */ (inbox.shift());
          yield msg;
          if (isTerminal(msg)) return;
        }
        await new Promise((resolve) => (wake = () => resolve(undefined)));
        wake = null;
      }
    } finally {
      signal?.removeEventListener("abort", stop);
      // A consumer that leaves early still owes the server a stop; the next chat waits for its end.
      if (!finished && this.routes.has(id)) stop();
    }
  }
}
