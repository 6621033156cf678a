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
 */

const OPEN = 1;
const CLOSE_TRY_AGAIN_LATER = 1013;

export class Connection {
  /**
   * @param {string} url
   * @param {ConnectionOptions} [options]
   */
  constructor(url, { WebSocket = globalThis.WebSocket, onStatus = () => {}, baseDelayMs = 500, maxDelayMs = 15000, random = Math.random } = {}) {
    this.url = url;
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
    this.onStatus({ state: this.attempt === 0 ? "connecting" : this.warming ? "warming" : "reconnecting", retryInMs: 0 });
    const socket = new this.WebSocket(this.url);
    this.socket = socket;
    socket.onopen = () => {
      this.attempt = 0;
      this.warming = false;
      this.onStatus({ state: "open", retryInMs: 0 });
      for (const wake of this.openWaiters) wake();
    };
    socket.onmessage = (event) => {
      const msg = parseServerMessage(event.data);
      if (!msg || msg.type === "pong") return;
      // Only `invalid_json` lacks an id, and it can only be about the chat in flight.
      const id = "id" in msg && msg.id !== null ? msg.id : [...this.routes.keys()][0];
      this.routes.get(id ?? "")?.(msg);
    };
    socket.onclose = (/** @type {{code?: number, reason?: string}} */ event) => {
      if (this.socket !== socket) return;
      this.socket = null;
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
    this.socket?.close();
  }

  /**
   * @private
   * @param {"reconnecting" | "warming" | "full"} state
   */
  scheduleRetry(state) {
    const ceiling = Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** this.attempt);
    const delay = Math.round(ceiling * (0.5 + this.random() / 2));
    this.attempt++;
    this.onStatus({ state, retryInMs: delay });
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
