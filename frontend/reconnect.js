// @ts-check
/**
 * An answer that survives the connection. `resumableChat` yields one chat's server messages, as
 * `Connection.chat` does, ending with exactly one terminal message; but when the socket drops mid-answer that is
 * not the end. It waits for the connection to reopen (the transport reconnects with backoff), then asks the server
 * that had the chat to `resume` it from the first token this page lacks (the secret token from its `start`), and
 * where that server does not know it (another replica, a restart) sends the chat again with `continue`: the text
 * and token ids this page holds, after which any server goes on (protocol v1, "Resuming an answer"). Given `from`,
 * what a page reloaded mid-answer held of it (resume.js), it starts there rather than asking.
 *
 * The consumer sees one chat: a single `start`, each token once and in order (an index already seen is never
 * yielded again), and between attempts a `reconnecting` message for a quiet note. It gives up, yielding the
 * `disconnected` error, only after `maxAttempts` reconnects in a row have failed while the browser was online:
 * offline, there is nothing to try until it is back.
 *
 * Stop pressed while the socket is down ends the answer here at once, and the stop goes out as soon as a socket
 * is back, ahead of any later question: the server runs a resumable chat on without its socket, so the page
 * takes it over (`resume`) and stops it. If it ended meanwhile, that is all.
 */

import { isTerminal } from "./protocol.js";

/** @typedef {import("./protocol.js").ServerMessage} ServerMessage */
/** @typedef {import("./protocol.js").ChatFrame} ChatFrame */
/** @typedef {import("./transport.js").Connection} Connection */
/** @typedef {import("./resume.js").Progress} Progress */

/**
 * @param {Connection} connection
 * @param {Extract<ChatFrame, {type: "chat"}>} frame
 * @param {AbortSignal} [signal]  abort to stop the answer
 * @param {{maxAttempts?: number, online?: () => boolean, from?: Progress | null,
 *   onProgress?: (progress: Progress) => void}} [options]
 *   `from`: the answer so far as a reloaded page holds it (its start is already shown, so none is yielded);
 *   `onProgress`: called whenever what resuming needs changes (a token, a resume token), to save it at once
 * @returns {AsyncGenerator<ServerMessage, void, void>}
 */
export async function* resumableChat(connection, frame, signal, options = {}) {
  const { maxAttempts = 6, online = () => navigator.onLine, from = null, onProgress = () => {} } = options;
  const id = frame.id;
  let token = from?.token ?? "";
  let started = from !== null;
  let next = from?.next ?? 0; // the first token index not yet received
  let text = from?.text ?? "";
  /** @type {number[]} */
  const ids = [...(from?.ids ?? [])];
  const progress = () => onProgress({ token, next, text, ids });
  /** @type {ChatFrame} */
  let request = from ? nextRequest(frame, token, next, text, ids) : { ...frame, resumable: true };
  for (let attempt = 1; ; attempt++) {
    let dropped = false;
    for await (const msg of connection.chat(request, signal)) {
      if (msg.type === "error" && (msg.code === "disconnected" || (msg.code === "not_found" && request.type === "resume"))) {
        dropped = msg.code === "disconnected";
        if (!dropped) {
          token = ""; // that server has no such chat: the next attempt continues it elsewhere
          progress();
        }
        break;
      }
      if (msg.type === "start" || msg.type === "queued") {
        const had = token;
        token = msg.resume_token ?? token;
        if (token !== had) progress();
        // a continuation's own start or queue, or the start again: the page already has its answer under way
        if (started) continue;
        if (msg.type === "start") started = true;
      } else if (msg.type === "resumed") {
        attempt = 0;
      } else if (msg.type === "token") {
        if (msg.index < next) continue;
        next = msg.index + 1;
        text += msg.text;
        ids.push(...(msg.ids ?? []));
        attempt = 0;
        progress();
      }
      yield msg;
      if (isTerminal(msg)) return;
    }
    if (dropped) {
      let stopping = false;
      const stop = () => {
        if (stopping || !token) return;
        stopping = true;
        stopWhenBack(connection, { type: "resume", id, token, from: next });
      };
      if (signal?.aborted) stop(); // Stop came as the socket died: its stop may never have reached the server
      else {
        signal?.addEventListener("abort", stop, { once: true });
        yield { type: "reconnecting", id, attempt };
      }
      const back = !signal?.aborted && (await reopened(connection, signal, maxAttempts, online));
      signal?.removeEventListener("abort", stop);
      if (!back) {
        if (signal?.aborted) stop();
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
 * Take a resumable chat over on the next socket and stop it there, without waiting for it: the transport sends a
 * `resume` even for an aborted signal, and a `stop` right after it (transport.js). Called while the socket is
 * down, it takes its place among the chats at once, so a question asked after the Stop goes out behind it.
 * @param {Connection} connection
 * @param {Extract<ChatFrame, {type: "resume"}>} request
 */
function stopWhenBack(connection, request) {
  const chat = connection.chat(request, AbortSignal.abort());
  (async () => {
    for await (const _ of chat); // the replay and its end: the page has stopped showing this answer
  })();
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
