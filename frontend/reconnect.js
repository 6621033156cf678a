// @ts-check
/**
 * An answer that survives the connection. `resumableChat` yields one chat's server messages, as
 * `Connection.chat` does, ending with exactly one terminal message; but when the socket drops mid-answer that is
 * not the end. It waits for the connection to reopen (the transport reconnects with backoff), then asks the server
 * that had the chat to `resume` it from the first token this page lacks (the secret token from its `start`), and
 * where that server does not know it (another replica, a restart) sends the chat again with `continue`: the text
 * and token ids this page holds, after which any server goes on (protocol v1, "Resuming an answer").
 *
 * The consumer sees one chat: a single `start`, each token once and in order (an index already seen is never
 * yielded again), and between attempts a `reconnecting` message for a quiet note. It gives up, yielding the
 * `disconnected` error, only after `maxAttempts` reconnects in a row have failed while the browser was online:
 * offline, there is nothing to try until it is back.
 */

import { isTerminal } from "./protocol.js";

/** @typedef {import("./protocol.js").ServerMessage} ServerMessage */
/** @typedef {import("./protocol.js").ChatFrame} ChatFrame */
/** @typedef {import("./transport.js").Connection} Connection */

/**
 * @param {Connection} connection
 * @param {Extract<ChatFrame, {type: "chat"}>} frame
 * @param {AbortSignal} [signal]  abort to stop the answer
 * @param {{maxAttempts?: number, online?: () => boolean}} [options]
 * @returns {AsyncGenerator<ServerMessage, void, void>}
 */
export async function* resumableChat(connection, frame, signal, { maxAttempts = 6, online = () => navigator.onLine } = {}) {
  const id = frame.id;
  let token = "";
  let started = false;
  let next = 0; // the first token index not yet received
  let text = "";
  /** @type {number[]} */
  const ids = [];
  /** @type {ChatFrame} */
  let request = { ...frame, resumable: true };
  for (let attempt = 1; ; attempt++) {
    let dropped = false;
    for await (const msg of connection.chat(request, signal)) {
      if (msg.type === "error" && (msg.code === "disconnected" || (msg.code === "not_found" && request.type === "resume"))) {
        dropped = msg.code === "disconnected";
        if (!dropped) token = ""; // that server has no such chat: the next attempt continues it elsewhere
        break;
      }
      if (msg.type === "start") {
        token = msg.resume_token ?? token;
        if (started) continue; // a continuation's own start, or the start again: the page already has one
        started = true;
      } else if (msg.type === "queued") {
        token = msg.resume_token ?? token;
        if (started) continue; // a continuation waiting for a slot: the answer on screen is already under way
      } else if (msg.type === "resumed") {
        attempt = 0;
      } else if (msg.type === "token") {
        if (msg.index < next) continue;
        next = msg.index + 1;
        text += msg.text;
        ids.push(...(msg.ids ?? []));
        attempt = 0;
      }
      yield msg;
      if (isTerminal(msg)) return;
    }
    if (dropped) {
      yield { type: "reconnecting", id, attempt };
      if (!(await reopened(connection, signal, maxAttempts, online))) {
        yield signal?.aborted
          ? { type: "end", id, reason: "cancelled", usage: null, timings: null }
          : { type: "error", id, code: "disconnected", message: "the connection closed" };
        return;
      }
    }
    request = nextRequest(frame, token, next, text, ids);
  }
}

/**
 * What to send on the new socket: a resume while a server may have the chat, else the chat again, continued after
 * the text so far (or from the start, when nothing had come yet).
 * @param {Extract<ChatFrame, {type: "chat"}>} frame
 * @param {string} token
 * @param {number} next
 * @param {string} text
 * @param {number[]} ids
 * @returns {ChatFrame}
 */
export function nextRequest(frame, token, next, text, ids) {
  if (token) return { type: "resume", id: frame.id, token, from: next };
  const again = { ...frame, resumable: true };
  if (!text) return again;
  return { ...again, continue: ids.length === next ? { text, ids } : { text } };
}

/**
 * Resolve true once the connection is open again; false when the signal aborts, or when `maxAttempts` attempts
 * in a row failed while online.
 * @param {Connection} connection
 * @param {AbortSignal | undefined} signal
 * @param {number} maxAttempts
 * @param {() => boolean} online
 */
async function reopened(connection, signal, maxAttempts, online) {
  if (connection.isOpen) return true;
  const giveUp = new AbortController();
  const abort = () => giveUp.abort();
  signal?.addEventListener("abort", abort, { once: true });
  let failed = 0;
  const watch = (/** @type {import("./transport.js").ConnectionStatus} */ status) => {
    if (status.retryInMs > 0 && online() && ++failed >= maxAttempts) giveUp.abort();
  };
  connection.watchers.add(watch);
  try {
    return (await connection.whenOpen(giveUp.signal)) && !signal?.aborted;
  } finally {
    connection.watchers.delete(watch);
    signal?.removeEventListener("abort", abort);
  }
}
