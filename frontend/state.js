// @ts-check
/**
 * The page's one state object: the conversation as a list of turns, each a question and its answer, and
 * how the connection is doing. Pure and DOM-free; storage is passed in (localStorage in the page). The
 * functions here return new turns rather than change the ones they are given.
 *
 * An answer may hold steps of the server's calculator (`tool_step` frames): each is kept with the length the
 * answer's text had when it came, so the page shows it there, between the text before and after it.
 *
 * A turn's answer moves through a lifecycle whose transitions are checked:
 *   waiting → queued → streaming → done | stopped | failed | interrupted
 * (waiting and queued may also end directly). A reload turns an unfinished answer into `interrupted`; one the page
 * finds again on the server (resume.js) goes back to `streaming`, with the text it had.
 *
 * The answer text has one owner. While the answer is live, `applyMessage` appends every token the server
 * sends, so `answer` is what was received; the screen types it out a few hundred milliseconds behind. When
 * the student presses Stop, `stopTurn` cuts `answer` back to what the screen shows, and an ended turn's
 * answer never changes again: a token that was already on its way is neither kept nor shown.
 */

import { droppedText, endText, errorText, queueText } from "./protocol.js";

/** @typedef {import("./protocol.js").ChatMessage} ChatMessage */
/** @typedef {import("./protocol.js").ServerMessage} ServerMessage */
/** @typedef {"waiting" | "queued" | "streaming" | "done" | "stopped" | "failed" | "interrupted"} TurnStatus */
/**
 * @typedef {object} Step  a calculation the server made for the answer
 * @property {number} at          the answer text's length when it came: it is shown after that much text
 * @property {number} index       its number in the answer, from 0
 * @property {string} expression
 * @property {string} result      the value, or why there is none
 * @property {string | null} error  the refusal's code, or null
 */
/**
 * @typedef {object} Turn
 * @property {string} id        the request id of the latest attempt
 * @property {string} question
 * @property {string} answer    the text received so far; once stopped, the text that was shown
 * @property {TurnStatus} status
 * @property {string} note      why it ended, in words ("Stopped", an error sentence), or ""
 * @property {string} stats     developer figures measured on the page (timing.js), or ""
 * @property {Step[]} [steps]   the calculator's steps, in order (none when absent)
 */

/** @type {TurnStatus[]} */
const ENDED = ["done", "stopped", "failed", "interrupted"];
/** @type {Record<TurnStatus, TurnStatus[]>} */
const NEXT = {
  waiting: ["queued", "streaming", ...ENDED],
  queued: ["queued", "streaming", ...ENDED],
  streaming: ENDED,
  done: [],
  stopped: [],
  failed: [],
  interrupted: ["streaming"], // only by resumeTurn, after a reload
};

/** @param {TurnStatus} status */
export const isLive = (status) => !ENDED.includes(status);

/**
 * The turn with a new status, if its lifecycle allows the move.
 * @param {Turn} turn
 * @param {TurnStatus} status
 * @returns {Turn}
 */
export function moveTo(turn, status) {
  if (!NEXT[turn.status].includes(status)) {
    throw new Error(`turn ${turn.id}: cannot go from ${turn.status} to ${status}`);
  }
  return { ...turn, status };
}

/**
 * The answer has begun (a `start`, or a token without one): a note about the queue no longer applies.
 * @param {Turn} turn
 */
const streaming = (turn) => (turn.status === "streaming" ? turn : { ...moveTo(turn, "streaming"), note: "" });

/**
 * The turn after one server frame of its chat (protocol v1: queued* start token* then end or error).
 * A frame for a turn that has already ended, as after a Stop, changes nothing.
 * @param {Turn} turn
 * @param {ServerMessage} frame
 * @returns {Turn}
 */
export function applyMessage(turn, frame) {
  if (!isLive(turn.status)) return turn;
  switch (frame.type) {
    case "queued":
      return { ...moveTo(turn, "queued"), note: queueText(frame.position) };
    case "start":
      return { ...streaming(turn), note: droppedText(frame.dropped_messages) };
    case "token":
      return { ...streaming(turn), answer: turn.answer + frame.text };
    case "tool_step": {
      const steps = turn.steps ?? [];
      if (steps.some((s) => s.index === frame.index)) return turn; // sent again after a resume
      const { index, expression, result, error } = frame;
      return { ...streaming(turn), steps: [...steps, { at: turn.answer.length, index, expression, result, error }] };
    }
    case "end":
      return {
        ...moveTo(turn, frame.reason === "cancelled" ? "stopped" : "done"),
        note: endText(frame.reason) || turn.note, // a natural end keeps the note about left-out messages
      };
    case "error":
      return { ...moveTo(turn, frame.code === "disconnected" ? "interrupted" : "failed"), note: errorText(frame.code) };
    default:
      return turn;
  }
}

/**
 * The student pressed Stop: the answer is what the screen shows at this moment, for good.
 * @param {Turn} turn
 * @param {string} shown  the text on screen, a prefix of what was received
 * @param {number} [stepsShown]  how many of its steps are on screen
 * @returns {Turn}
 */
export function stopTurn(turn, shown, stepsShown = turn.steps?.length ?? 0) {
  const steps = (turn.steps ?? []).slice(0, stepsShown);
  return { ...moveTo(turn, "stopped"), answer: shown, note: endText("cancelled"), steps };
}

/**
 * The page was reloaded while this answer streamed, and it will resume it: the answer goes on from `text`, the text
 * the page holds with the resume's starting point (resume.js), which may be less than the turn saved.
 * @param {Turn} turn  as restored: `interrupted`
 * @param {string} text
 * @returns {Turn}
 */
export function resumeTurn(turn, text) {
  return { ...moveTo(turn, "streaming"), answer: text, note: "" };
}

/**
 * @typedef {object} State
 * @property {Turn[]} turns  the open chat's turns (chats.js keeps every chat and saves them)
 * @property {"connecting" | "open" | "reconnecting" | "warming" | "full"} connection
 * @property {number} retryInMs
 * @property {string} progress  while warming: how far the server's load has come, in its words (for developers)
 * @property {{fraction?: number, leftS?: number}} load  while warming: the share of its step done and the seconds
 *   it has left, where the server has a basis for them (/readyz)
 * @property {string} model  the server's model id, shown while nothing is being written ("" when unknown)
 */

/**
 * @param {string} [model]
 * @returns {State}
 */
export function emptyState(model = "") {
  return { turns: [], connection: "connecting", retryInMs: 0, progress: "", load: {}, model };
}

/**
 * Turns as saved before a reload, checked one by one: a damaged one is left out, and an answer that was
 * still live comes back as `interrupted`.
 * @param {unknown} saved
 * @returns {Turn[]}
 */
export function restoreTurns(saved) {
  /** @type {Turn[]} */
  const turns = [];
  if (!Array.isArray(saved)) return turns;
  for (const t of saved) {
    if (!t || typeof t.question !== "string" || typeof t.answer !== "string" || !(t.status in NEXT)) continue;
    const status = isLive(t.status) ? "interrupted" : t.status;
    const note = status === "interrupted" && isLive(t.status) ? "The page was reloaded before this answer finished." : String(t.note ?? "");
    const steps = restoreSteps(t.steps, t.answer.length);
    turns.push({ id: String(t.id ?? ""), question: t.question, answer: t.answer, status, note, stats: String(t.stats ?? ""), steps });
  }
  return turns;
}

/**
 * Saved steps, checked: a damaged one, or one past the answer's end, is left out.
 * @param {unknown} saved
 * @param {number} length  the answer's length
 * @returns {Step[]}
 */
function restoreSteps(saved, length) {
  if (!Array.isArray(saved)) return [];
  return saved
    .filter((s) => s && Number.isInteger(s.at) && s.at >= 0 && s.at <= length && Number.isInteger(s.index) &&
      typeof s.expression === "string" && typeof s.result === "string" && (s.error == null || typeof s.error === "string"))
    .map(({ at, index, expression, result, error }) => ({ at, index, expression, result, error: error ?? null }));
}

/**
 * The messages to send for the last turn: every earlier exchange that has an answer, then the question.
 * A question whose answer failed with no text is left out, so roles keep alternating.
 * @param {Turn[]} turns   the last one is the turn being asked
 * @returns {ChatMessage[]}
 */
export function messagesFor(turns) {
  /** @type {ChatMessage[]} */
  const messages = [];
  for (const turn of turns.slice(0, -1)) {
    if (!turn.answer.trim()) continue;
    messages.push({ role: "user", content: turn.question }, { role: "assistant", content: turn.answer });
  }
  const last = turns[turns.length - 1];
  if (last) messages.push({ role: "user", content: last.question });
  return messages;
}

/**
 * Trim a conversation to the server's limits by dropping the oldest exchanges; the question always stays.
 * Returns null when even the question alone is too big to send (a frame over the limit closes the socket).
 * @param {ChatMessage[]} messages  user/assistant pairs, then the question
 * @param {{maxMessages?: number, maxBytes?: number, size: (messages: ChatMessage[]) => number}} limits
 * @returns {ChatMessage[] | null}
 */
export function fitToLimits(messages, { maxMessages = Infinity, maxBytes = Infinity, size }) {
  let kept = messages;
  const fits = () => kept.length <= maxMessages && size(kept) <= maxBytes;
  while (!fits() && kept.length > 1) kept = kept.slice(2);
  return fits() ? kept : null;
}
