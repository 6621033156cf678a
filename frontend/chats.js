// @ts-check
/**
 * The student's kept chats: every conversation, in localStorage, so a reload or tomorrow's lesson finds them.
 * Pure apart from the storage it is handed (localStorage in the page, a Map-backed one in tests).
 *
 * Storage is small (about 5 MB a site, and shared), so the list is bounded: at most `maxChats` chats and
 * `maxChars` characters saved. When a save would pass either bound, the chats touched longest ago go first,
 * never the open one; `saveChats` says which went, so the page can say so. If the open chat alone is too big,
 * its oldest turns go. A browser that refuses to store more (quota, private mode) is treated the same way,
 * and if nothing can be stored at all the page still works, just without memory.
 */

import { restoreTurns } from "./state.js";

/** @typedef {import("./state.js").Turn} Turn */
/**
 * @typedef {object} Chat
 * @property {string} id
 * @property {string} title    what the student named it, or "" to use its first question
 * @property {number} updated  when it last changed (ms since the epoch): the oldest goes first
 * @property {Turn[]} turns
 */
/** @typedef {{current: string, chats: Chat[]}} ChatList  `chats` newest first; `current` is the open one */
/** @typedef {{maxChats: number, maxChars: number}} Limits */

export const CHATS_KEY = "typewriter.chats.v1";
/** Where the page kept its one conversation before it kept many: read once, then replaced. */
export const OLD_KEY = "typewriter.conversation.v1";
/** @type {Limits} */
export const LIMITS = { maxChats: 40, maxChars: 1_500_000 };
const TITLE_CHARS = 60;

/** @param {number} now */
const newChatId = (now) => `c${now.toString(36)}${Math.random().toString(36).slice(2, 8)}`;

/**
 * @param {number} now
 * @returns {Chat}
 */
export function emptyChat(now) {
  return { id: newChatId(now), title: "", updated: now, turns: [] };
}

/**
 * The saved chats; always at least one, and `current` is one of them.
 * @param {Pick<Storage, "getItem">} storage
 * @param {number} [now]
 * @returns {ChatList}
 */
export function loadChats(storage, now = Date.now()) {
  /** @type {ChatList} */
  const list = { current: "", chats: [] };
  const saved = readJson(storage, CHATS_KEY);
  if (saved && Array.isArray(saved.chats)) {
    for (const c of saved.chats) {
      if (!c || typeof c.id !== "string" || list.chats.some((x) => x.id === c.id)) continue;
      const updated = Number.isFinite(c.updated) ? c.updated : 0;
      list.chats.push({ id: c.id, title: typeof c.title === "string" ? c.title : "", updated, turns: restoreTurns(c.turns) });
    }
    list.current = typeof saved.current === "string" ? saved.current : "";
  } else {
    const old = readJson(storage, OLD_KEY);
    const turns = restoreTurns(old?.turns);
    if (turns.length) list.chats.push({ ...emptyChat(now), turns });
  }
  list.chats.sort((a, b) => b.updated - a.updated);
  if (!list.chats.length) list.chats.push(emptyChat(now));
  if (!list.chats.some((c) => c.id === list.current)) list.current = list.chats[0].id;
  return list;
}

/**
 * @param {Pick<Storage, "getItem">} storage
 * @param {string} key
 */
function readJson(storage, key) {
  try {
    return JSON.parse(storage.getItem(key) ?? "null");
  } catch {
    return null;
  }
}

/**
 * @param {ChatList} list
 * @returns {Chat}
 */
export function currentChat(list) {
  return /** @type {Chat} */ (list.chats.find((c) => c.id === list.current));
}

/**
 * What the list shows for a chat: its name, else its first question, shortened.
 * @param {Chat} chat
 */
export function titleOf(chat) {
  const text = (chat.title || chat.turns[0]?.question || "").replace(/\s+/g, " ").trim();
  if (!text) return "New chat";
  return text.length > TITLE_CHARS ? `${text.slice(0, TITLE_CHARS - 1).trimEnd()}…` : text;
}

/**
 * Open a new, empty chat (an empty open chat is reused rather than piling up).
 * @param {ChatList} list
 * @param {number} [now]
 * @returns {Chat}
 */
export function startChat(list, now = Date.now()) {
  const open = currentChat(list);
  if (open.turns.length === 0 && !open.title) return open;
  const chat = emptyChat(now);
  list.chats.unshift(chat);
  list.current = chat.id;
  return chat;
}

/**
 * @param {ChatList} list
 * @param {string} id
 * @returns {Chat | undefined}
 */
export function openChat(list, id) {
  const chat = list.chats.find((c) => c.id === id);
  if (chat) list.current = id;
  return chat;
}

/**
 * @param {ChatList} list
 * @param {string} id
 * @param {string} title  "" goes back to the first question
 */
export function renameChat(list, id, title) {
  const chat = list.chats.find((c) => c.id === id);
  if (chat) chat.title = title.replace(/\s+/g, " ").trim().slice(0, 200);
}

/**
 * Delete a chat; deleting the open one opens the newest other one, or a new empty chat.
 * @param {ChatList} list
 * @param {string} id
 * @param {number} [now]
 */
export function deleteChat(list, id, now = Date.now()) {
  list.chats = list.chats.filter((c) => c.id !== id);
  if (!list.chats.length) list.chats.push(emptyChat(now));
  if (list.current === id) list.current = list.chats[0].id;
}

/**
 * The open chat changed: it moves to the top of the list.
 * @param {ChatList} list
 * @param {number} [now]
 */
export function touch(list, now = Date.now()) {
  const chat = currentChat(list);
  chat.updated = now;
  list.chats = [chat, ...list.chats.filter((c) => c !== chat)];
}

/**
 * Make the list fit the limits, dropping the chats touched longest ago first (never the open one), then
 * the open chat's oldest turns. Returns what was dropped.
 * @param {ChatList} list
 * @param {Limits} limits
 * @returns {{chats: Chat[], turns: number}}
 */
export function fitChats(list, { maxChats, maxChars }) {
  /** @type {Chat[]} */
  const dropped = [];
  let turns = 0;
  const size = () => serialise(list).length;
  const oldestOther = () => {
    let oldest = -1;
    list.chats.forEach((c, i) => {
      if (c.id !== list.current && (oldest === -1 || c.updated < list.chats[oldest].updated)) oldest = i;
    });
    return oldest;
  };
  while (list.chats.length > maxChats || size() > maxChars) {
    const i = oldestOther();
    if (i !== -1) {
      dropped.push(...list.chats.splice(i, 1));
      continue;
    }
    const open = currentChat(list);
    if (open.turns.length <= 1) break; // the last question is kept whatever its size
    open.turns.splice(0, 1);
    turns++;
  }
  return { chats: dropped, turns };
}

/** @param {ChatList} list */
const serialise = (list) => JSON.stringify({ current: list.current, chats: list.chats });

/**
 * Save the list within the limits. The storage may refuse (full, disabled): then the oldest chats go and
 * it is tried again, until only the open chat is left.
 * @param {Pick<Storage, "setItem" | "removeItem">} storage
 * @param {ChatList} list
 * @param {Limits} [limits]
 * @returns {{chats: Chat[], turns: number, saved: boolean}}  what had to go to make room, and whether it saved
 */
export function saveChats(storage, list, limits = LIMITS) {
  const dropped = fitChats(list, limits);
  for (;;) {
    try {
      storage.setItem(CHATS_KEY, serialise(list));
      storage.removeItem(OLD_KEY);
      return { ...dropped, saved: true };
    } catch {
      const fewer = fitChats(list, { ...limits, maxChats: list.chats.length - 1 });
      if (!fewer.chats.length && !fewer.turns) return { ...dropped, saved: false };
      dropped.chats.push(...fewer.chats);
      dropped.turns += fewer.turns;
    }
  }
}

/**
 * The notice when saving dropped something, or "".
 * @param {{chats: Chat[], turns: number}} dropped
 */
export function droppedNotice({ chats, turns }) {
  const parts = [];
  if (chats.length === 1) parts.push(`Your oldest chat, “${titleOf(chats[0])}”, was removed to make room.`);
  else if (chats.length > 1) parts.push(`Your ${chats.length} oldest chats were removed to make room.`);
  if (turns > 0) {
    parts.push(turns === 1 ? "This chat's first question was removed to make room." : `This chat's first ${turns} questions were removed to make room.`);
  }
  return parts.join(" ");
}
