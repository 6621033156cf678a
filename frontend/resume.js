// @ts-check
/**
 * The running answer as a reload needs it: the chat frame it was asked with, the resume token from its `start`,
 * the first token index the page lacks, and the text and token ids it holds. The page saves it at each token
 * while the answer streams and clears it when the answer ends; after a reload (a phone that discarded a
 * background tab reloads it too) it finds the open chat's unfinished answer here and resumes it from `next`,
 * with `text` already on screen (protocol v1, "Resuming an answer"). Pure apart from the storage it is handed.
 *
 * The storage is sessionStorage, never localStorage: the resume token is a bearer secret that opens this one
 * answer to whoever holds it, and sessionStorage is this tab's alone (it survives the tab's reloads and goes when
 * the tab closes), where localStorage is read by every tab of the site and kept on disk for good.
 */

/** @typedef {Extract<import("./protocol.js").ChatFrame, {type: "chat"}>} Chat */
/**
 * What resuming needs to know of the answer so far (reconnect.js keeps it up to date).
 * @typedef {object} Progress
 * @property {string} token  the chat's resume token; "" when no server is known to keep it (then `continue`)
 * @property {number} next   the first token index the page lacks
 * @property {string} text   the answer's text the page holds
 * @property {number[]} ids  the token ids of that text
 */
/**
 * @typedef {Progress & {chat: string, frame: Chat}} SavedAnswer
 *   `chat`: the id of the kept chat (chats.js) the answer belongs to; `frame.id` is its turn's id
 */

export const RESUME_KEY = "typewriter.resume.v1";

/**
 * Save the answer's progress; a storage that refuses (full, disabled) only means a reload cannot resume it.
 * @param {Pick<Storage, "setItem">} storage
 * @param {SavedAnswer} saved
 * @returns {boolean} whether it was saved
 */
export function saveAnswer(storage, saved) {
  try {
    storage.setItem(RESUME_KEY, JSON.stringify(saved));
    return true;
  } catch {
    return false;
  }
}

/**
 * The saved answer, checked field by field; null when there is none or it is damaged.
 * @param {Pick<Storage, "getItem">} storage
 * @returns {SavedAnswer | null}
 */
export function loadAnswer(storage) {
  let s;
  try {
    s = JSON.parse(storage.getItem(RESUME_KEY) ?? "null");
  } catch {
    return null;
  }
  if (!s || typeof s !== "object" || typeof s.chat !== "string" || typeof s.token !== "string") return null;
  if (!Number.isInteger(s.next) || s.next < 0 || typeof s.text !== "string") return null;
  if (!Array.isArray(s.ids) || !s.ids.every(Number.isInteger)) return null;
  const f = s.frame;
  if (!f || f.type !== "chat" || typeof f.id !== "string" || !f.id || !Array.isArray(f.messages)) return null;
  return { chat: s.chat, frame: f, token: s.token, next: s.next, text: s.text, ids: s.ids };
}

/**
 * Forget the saved answer: with a turn id, only if it is that turn's (a newer answer's may already have taken its
 * place) or damaged.
 * @param {Pick<Storage, "getItem" | "removeItem">} storage
 * @param {string | null} [turnId]
 */
export function clearAnswer(storage, turnId = null) {
  const saved = turnId === null ? null : loadAnswer(storage);
  if (saved && saved.frame.id !== turnId) return;
  try {
    storage.removeItem(RESUME_KEY);
  } catch {
    // nothing is kept then either
  }
}

/**
 * The saved answer if it is the unfinished last answer of the open chat: the one a reload should resume.
 * @param {SavedAnswer | null} saved
 * @param {string} chatId  the open chat
 * @param {import("./state.js").Turn | undefined} last  its last turn, as restored (an unfinished one is `interrupted`)
 * @returns {SavedAnswer | null}
 */
export function answerToResume(saved, chatId, last) {
  if (!saved || !last || saved.chat !== chatId || saved.frame.id !== last.id || last.status !== "interrupted") return null;
  return saved;
}
