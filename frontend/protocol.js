// @ts-check
/**
 * Protocol v1 as the page sees it: the frames, and what each outcome means in words a student understands.
 * Pure and DOM-free. The wire format itself is specified in the server's protocol documentation.
 */

/**
 * @typedef {{role: "system" | "user" | "assistant", content: string}} ChatMessage
 * @typedef {{type: "chat", id: string, messages: ChatMessage[], params?: Record<string, unknown>, resumable?: boolean,
 *   continue?: {text: string, ids?: number[]}} | {type: "resume", id: string, token: string, from: number}} ChatFrame
 * @typedef {{prompt_tokens: number, completion_tokens: number}} Usage
 * @typedef {{queue_ms: number, ttft_ms: number, total_ms: number, tokens_per_s: number}} Timings
 * @typedef {"eos" | "length" | "stop_sequence" | "repetition" | "cancelled" | "timeout" | "queue_timeout" | "shutdown" | "resume_buffer_full"} EndReason
 * @typedef {{type: "queued", id: string, position: number}
 *   | {type: "start", id: string, prompt_tokens: number, cached_tokens?: number, dropped_messages?: number, resume_token?: string}
 *   | {type: "token", id: string, index: number, text: string, ids?: number[]}
 *   | {type: "resumed", id: string}
 *   | {type: "tool_step", id: string, index: number, name: string, expression: string, result: string, error: string | null}
 *   | {type: "reconnecting", id: string, attempt: number}
 *   | {type: "end", id: string, reason: EndReason, usage: Usage | null, timings: Timings | null}
 *   | {type: "error", id: string | null, code: string, message: string}
 *   | {type: "pong"}} ServerMessage
 */

/**
 * A fresh request id: 24 hex characters. crypto.randomUUID needs a secure context; this does not.
 * @returns {string}
 */
export function newId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Parse one text frame from the server; null if it is not a message this page understands.
 * @param {unknown} data
 * @returns {ServerMessage | null}
 */
export function parseServerMessage(data) {
  if (typeof data !== "string") return null;
  let msg;
  try {
    msg = JSON.parse(data);
  } catch {
    return null;
  }
  if (!msg || typeof msg !== "object" || typeof msg.type !== "string") return null;
  switch (msg.type) {
    case "token":
      return typeof msg.id === "string" && typeof msg.text === "string" ? msg : null;
    case "queued":
      return typeof msg.id === "string" && Number.isFinite(msg.position) ? msg : null;
    case "start":
    case "end":
      return typeof msg.id === "string" ? { usage: null, timings: null, ...msg } : null;
    case "error":
      return typeof msg.code === "string" ? { id: null, message: "", ...msg } : null;
    case "resumed":
      return typeof msg.id === "string" ? msg : null;
    case "tool_step":
      return typeof msg.id === "string" && Number.isInteger(msg.index) && typeof msg.expression === "string" &&
        typeof msg.result === "string" && (msg.error == null || typeof msg.error === "string")
        ? { name: "calculator", ...msg, error: msg.error ?? null }
        : null;
    case "pong":
      return msg;
    default:
      return null;
  }
}

/** @param {ServerMessage} msg */
export const isTerminal = (msg) => msg.type === "end" || msg.type === "error";

/**
 * What a queue position means to the person waiting. The server counts from 1, "next to start".
 * @param {number} position
 */
export function queueText(position) {
  const ahead = Math.max(0, Math.round(position) - 1);
  if (ahead === 0) return "You're next — the tutor will start in a moment.";
  return ahead === 1 ? "1 person ahead of you" : `${ahead} people ahead of you`;
}

/**
 * Error codes in plain words. Two are the page's own: `disconnected` (the connection dropped mid-answer) and
 * `question_too_long` (over the server's frame limit, so never sent).
 */
const ERROR_TEXT = /** @type {Record<string, string>} */ ({
  prompt_too_long:
    "This conversation is now too long for the tutor to read. Start a new chat, or ask a shorter question.",
  question_too_long: "That question is too long to send. Please shorten it, or split it into parts.",
  overloaded: "The tutor is helping a lot of students right now. Please try again in a minute.",
  busy: "The tutor is still answering your last question. Wait for it to finish, or press Stop.",
  invalid_request: "The tutor couldn't read that message. Please try again; if it keeps happening, start a new chat.",
  invalid_json: "Your message got garbled on the way. Please reload the page and try again.",
  system_prompt_not_allowed: "This tutor keeps its own instructions; the page tried to change them. Please reload it.",
  not_found: "That answer had already finished.",
  rate_limited: "That's a lot of questions in a short time. Take a moment, then ask again.",
  shutdown: "The tutor is restarting. It will reconnect by itself in a moment; then ask again.",
  internal: "Something went wrong on the tutor's side. Please try again.",
  not_supported: "The tutor can't do what the page asked for (a tool or answer format this model lacks).",
  disconnected: "The connection dropped before the answer finished. It will reconnect by itself; then try again.",
});

/**
 * @param {string} code
 * @returns {string}
 */
export function errorText(code) {
  return ERROR_TEXT[code] ?? ERROR_TEXT.internal;
}

/** How an answer ended, when that is worth telling; a natural ending says nothing. */
const END_TEXT = /** @type {Record<string, string>} */ ({
  cancelled: "Stopped",
  length: "The answer reached its length limit.",
  repetition: "The answer started repeating itself, so it was stopped.",
  timeout: "The answer took too long and was cut short.",
  queue_timeout: "The tutor was too busy to start your answer in time. Please ask again in a moment.",
  shutdown: "The tutor restarted before finishing. Please ask again.",
  resume_buffer_full: "The connection was away too long for the tutor to keep the rest of this answer. Please ask again.",
});

/**
 * The server left the oldest messages out of a conversation too long for the model: said quietly.
 * @param {number | undefined} dropped
 */
export function droppedText(dropped) {
  if (!dropped || dropped < 1) return "";
  return dropped === 1
    ? "The tutor no longer sees the first message of this chat."
    : `The tutor no longer sees the first ${dropped} messages of this chat.`;
}

/**
 * @param {string} reason
 * @returns {string}
 */
export function endText(reason) {
  return END_TEXT[reason] ?? "";
}
