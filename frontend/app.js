// @ts-check
/**
 * The page: wires the state, the transport, the pacer and the turn views to the DOM.
 *
 * One answer is live at a time. Its messages come from `connection.chat` and go through `applyMessage`
 * (state.js), which keeps the received text; the text a frame adds goes into a Pacer, and a
 * requestAnimationFrame loop moves what the pacer releases into the turn's Writer. Stop halts the display
 * where it is and keeps that text as the answer; the server's `end` (reason `cancelled`) follows. A question
 * asked while the tutor gets ready is held by the transport and sent once it is; the status line says so.
 * An AnswerClock (timing.js) measures each answer on the page; its figures show with the developer setting.
 *
 * Every chat is kept (chats.js); `state.turns` is the open chat's own array of turns, changed in place.
 * The chat list (chatlist.js) opens, renames and deletes them.
 *
 * An answer survives a dropped connection (reconnect.js): the socket reopens, the answer resumes where the screen
 * stopped, and the status line says "reconnecting" meanwhile; the turn fails only after several failed attempts.
 * The socket's URL names the open chat (`?conversation=`), so a balancer sends a conversation to the replica that
 * holds its cache and its kept answer. A reload mid-answer finds it again: what resuming needs is saved in this
 * tab's sessionStorage at each token (resume.js), and the reloaded page shows the text it had and resumes the rest.
 */

import { ChatList } from "./chatlist.js";
import { CHATS_KEY, currentChat, deleteChat, droppedNotice, loadChats, openChat, renameChat, saveChats, startChat, titleOf, touch } from "./chats.js";
import { copyText } from "./clipboard.js";
import { highlightCode, languageName } from "./code.js";
import { developerMode } from "./developer.js";
import { renderFormula } from "./formula.js";
import { Notice } from "./notice.js";
import { Pacer, wholeWords } from "./pacing.js";
import { isTerminal, newId } from "./protocol.js";
import { resumableChat } from "./reconnect.js";
import { answerToResume, clearAnswer, loadAnswer, saveAnswer } from "./resume.js";
import { applyMessage, emptyState, fitToLimits, isLive, messagesFor, resumeTurn, stopTurn } from "./state.js";
import { heldText, statusLine } from "./status.js";
import { AnswerClock } from "./timing.js";
import { Connection } from "./transport.js";
import { TurnView } from "./view.js";

/** @typedef {import("./state.js").Turn} Turn */
/** @typedef {import("./resume.js").SavedAnswer} SavedAnswer */

/** @param {string} id */
const byId = (id) => /** @type {HTMLElement} */ (document.getElementById(id));

/** Server settings, rendered into the page as JSON (templates/index.html). Every key is optional. */
const settings = (() => {
  try {
    const parsed = JSON.parse(byId("settings")?.textContent || "{}");
    return parsed && typeof parsed === "object" ? parsed : {};
  } catch {
    return {};
  }
})();
const wsPath = typeof settings.ws_path === "string" ? settings.ws_path : "/ws";
const readyPath = typeof settings.readyz_path === "string" ? settings.readyz_path : "/readyz";
/** Developer figures under each answer: `?dev=1` turns them on (kept in this browser), `?dev=0` off. */
const developer = developerMode(location.search, localStorage);
/** @param {unknown} n */
const limit = (n) => (typeof n === "number" && n > 0 ? n : Infinity);
const encoder = new TextEncoder();
/** Where the live answer's resume token and progress wait for a reload (resume.js says why not localStorage); null
 * where the browser gives the page none (then a reload cannot resume). */
const tabStorage = (() => {
  try {
    return sessionStorage;
  } catch {
    return null;
  }
})();
/** With reduced motion the answer appears a word at a time, with no blinking caret (style.css). */
const reducedMotion = matchMedia("(prefers-reduced-motion: reduce)");
/** @type {import("./render.js").Extras} */
const extras = { math: renderFormula, code: highlightCode, label: languageName };

const thread = byId("thread");
const form = /** @type {HTMLFormElement} */ (byId("composer"));
const input = /** @type {HTMLTextAreaElement} */ (byId("question"));
const sendButton = /** @type {HTMLButtonElement} */ (byId("send"));
const stopButton = /** @type {HTMLButtonElement} */ (byId("stop"));
const statusBar = byId("status");
const jumpButton = /** @type {HTMLButtonElement} */ (byId("jump"));
const notice = new Notice(byId("notice"));
const say = notice.say.bind(notice);

const chats = loadChats(localStorage);
const state = emptyState(typeof settings.model === "string" ? settings.model : "");
state.turns = currentChat(chats).turns;
/** @type {Map<Turn, TurnView>} */
const views = new Map();
/** The answer being written, if any. */
let live = /** @type {{turn: Turn, controller: AbortController, pacer: Pacer} | null} */ (null);
/** Auto-scroll follows the answer until the student scrolls up, and again once they are back at the bottom. */
let follow = true;

const wsUrl = new URL(wsPath, location.href.replace(/^http/, "ws"));
const connection = new Connection(() => `${wsUrl.href}${wsUrl.search ? "&" : "?"}conversation=${encodeURIComponent(chats.current)}`, {
  readyUrl: new URL(readyPath, location.href).href,
  onStatus: ({ state: s, retryInMs, progress = "", fraction, leftS }) => {
    state.connection = s;
    state.retryInMs = retryInMs;
    state.progress = progress;
    state.load = { fraction, leftS };
    showStatus();
  },
});

function showStatus() {
  const { text, state: s } = statusLine(state, live && isLive(live.turn.status) ? live.turn : null, developer);
  statusBar.textContent = text;
  statusBar.dataset.state = s;
  // A question not sent yet (no socket, or the tutor getting ready) says under it that it is kept.
  const held = live?.turn.status === "waiting" ? heldText(state.connection) : null;
  if (live && held !== null && held !== live.turn.note) commit(live.turn, { ...live.turn, note: held });
}

function persist() {
  const dropped = saveChats(localStorage, chats);
  const said = droppedNotice(dropped);
  if (said) say(said);
  else if (!dropped.saved) say("Your browser is not keeping chats (storage is full or switched off): this one will be lost on reload.");
  if (dropped.turns) dropLostViews(); // the open chat lost its oldest turns
  chatList.render(chats);
}

/** Remove the views of turns no longer in the open chat (the live one, always the last, keeps its view). */
function dropLostViews() {
  for (const [turn, view] of views) {
    if (state.turns.includes(turn)) continue;
    view.root.remove();
    views.delete(turn);
  }
}

/**
 * A turn object is shared by `state.turns`, its view and `live`, so the new turn that state.js returns is
 * copied into it rather than swapped for it.
 * @param {Turn} turn
 * @param {Turn} next
 */
function commit(turn, next) {
  Object.assign(turn, next);
  views.get(turn)?.update();
}

/** @param {Turn} turn */
function addView(turn) {
  const view = new TurnView(turn, { copy, regenerate, resend }, extras, { showStats: developer });
  views.forEach((v) => (v.isLast = false));
  view.isLast = true;
  views.set(turn, view);
  thread.append(view.root);
  return view;
}

function scrollToEnd() {
  thread.scrollTop = thread.scrollHeight;
}

function updateComposer() {
  const writing = live !== null && isLive(live.turn.status);
  stopButton.hidden = !writing;
  sendButton.hidden = writing;
  jumpButton.hidden = follow || !writing;
}

/**
 * Ask for the turn's answer and show it as it comes; or, given what a reloaded page saved of it, resume it.
 * @param {Turn} turn
 * @param {SavedAnswer | null} [saved]  its chat frame and progress, its text already on screen
 */
async function answer(turn, saved = null) {
  const clock = new AnswerClock(performance.now()); // the question was sent just now
  const view = views.get(turn) ?? addView(turn);
  const pacer = new Pacer();
  const controller = new AbortController();
  live = { turn, controller, pacer };
  follow = true;
  scrollToEnd();
  updateComposer();
  showStatus();

  let ended = false;
  /** The figures, once the chat has ended and its first character is on screen (or never will be). */
  const settleStats = () => {
    if (saved) return; // resumed after a reload: the page saw neither its question go nor its first token come
    if (!ended || turn.stats || (clock.shownAt === null && !pacer.done && !controller.signal.aborted)) return;
    commit(turn, { ...turn, stats: clock.summary() });
    persist();
  };

  let unshown = ""; // released by the pacer, held back until its word is complete (reduced motion)
  const tick = (/** @type {number} */ now) => {
    unshown = controller.signal.aborted ? "" : unshown + pacer.take(now); // Stop halts the display at once
    const text = reducedMotion.matches && !pacer.done ? wholeWords(unshown) : unshown;
    unshown = unshown.slice(text.length);
    const stepDue = view.typer.shown < (turn.steps?.length ?? 0); // a step may come with no text after it yet
    if (text || stepDue) {
      view.type(text);
      if (text) clock.shown(performance.now());
      if (follow) scrollToEnd();
    }
    if (pacer.done) {
      view.finishTyping();
      if (follow) scrollToEnd();
    } else requestAnimationFrame(tick);
    settleStats();
  };
  requestAnimationFrame(tick);

  /** @param {import("./protocol.js").ChatMessage[]} messages */
  const frameWith = (messages) => ({ type: /** @type {const} */ ("chat"), id: turn.id, messages });
  const messages = saved
    ? null
    : fitToLimits(messagesFor(state.turns), {
        maxMessages: limit(settings.max_messages),
        maxBytes: limit(settings.max_message_bytes) - 64, // room for the id and framing
        size: (m) => encoder.encode(JSON.stringify(frameWith(m))).length,
      });
  const frame = saved?.frame ?? (messages && frameWith(messages));
  const chatId = chats.current;
  /** @param {import("./resume.js").Progress} progress */
  const keep = (progress) => frame && tabStorage && saveAnswer(tabStorage, { chat: chatId, frame, ...progress });
  const chat = frame
    ? resumableChat(connection, frame, controller.signal, { from: saved, onProgress: keep })
    : tooLong(turn.id);
  for await (const msg of chat) {
    const next = applyMessage(turn, msg);
    // applyMessage only ever appends to a live answer, and leaves an ended one (after Stop) as it is.
    const arrived = next.answer.slice(turn.answer.length);
    commit(turn, next);
    if (arrived) {
      pacer.push(arrived, performance.now());
      clock.received(arrived, performance.now());
    }
    if (isTerminal(msg)) {
      pacer.end(performance.now());
      clock.ended(performance.now());
    }
    showStatus();
  }
  if (tabStorage) clearAnswer(tabStorage, turn.id);
  if (live?.turn === turn) live = null;
  ended = true;
  settleStats();
  persist();
  updateComposer();
  showStatus();
}

/**
 * The question alone is over the server's frame limit: sending it would close the socket, so say so here.
 * @param {string} id
 */
async function* tooLong(id) {
  yield /** @type {import("./protocol.js").ServerMessage} */ ({ type: "error", id, code: "question_too_long", message: "" });
}

/** Stop the live answer: the display halts now and what it shows is kept. */
function stop() {
  if (!live || !isLive(live.turn.status)) return;
  const { turn, controller, pacer } = live;
  pacer.discard();
  controller.abort();
  const view = views.get(turn);
  commit(turn, stopTurn(turn, view?.writer.source ?? "", view?.typer.shown));
  persist();
  updateComposer();
  showStatus();
  input.focus();
}

/** @param {string} question */
function ask(question) {
  stop();
  const turn = /** @type {Turn} */ ({ id: newId(), question, answer: "", status: "waiting", note: "", stats: "", steps: [] });
  state.turns.push(turn);
  touch(chats);
  persist();
  answer(turn);
}

/**
 * The student edited an earlier question: it is asked again as edited, and the turns after it are dropped.
 * @param {Turn} turn
 * @param {string} question
 */
function resend(turn, question) {
  const at = state.turns.indexOf(turn);
  if (at === -1 || !question.trim()) return;
  stop();
  for (const dropped of state.turns.splice(at)) {
    views.get(dropped)?.root.remove();
    views.delete(dropped);
  }
  ask(question.trim());
}

/** @param {Turn} turn */
function regenerate(turn) {
  if (state.turns[state.turns.length - 1] !== turn || (live && isLive(live.turn.status))) return;
  state.turns.pop();
  views.get(turn)?.root.remove();
  views.delete(turn);
  ask(turn.question);
}

/**
 * @param {Turn} turn
 * @param {HTMLButtonElement} button
 */
function copy(turn, button) {
  return copyText(turn.answer, button);
}

/** Show the open chat's turns, as after a reload. */
function showChat() {
  state.turns = currentChat(chats).turns;
  views.clear();
  thread.replaceChildren();
  for (const turn of state.turns) {
    const view = addView(turn);
    if (isLive(turn.status)) view.writer.feed(turn.answer); // resumed after a reload: the answer goes on
    else view.showFinished();
  }
  follow = true;
  scrollToEnd();
  updateComposer();
  showStatus();
}

function newChat() {
  stop();
  startChat(chats);
  showChat();
  persist();
  input.focus();
}

const chatList = new ChatList(byId("chats"), {
  open(id) {
    if (id === chats.current) return;
    stop();
    openChat(chats, id);
    showChat();
    persist();
  },
  rename(id, title) {
    renameChat(chats, id, title);
    persist();
  },
  remove(id) {
    const chat = chats.chats.find((c) => c.id === id);
    if (!chat) return;
    const wasOpen = id === chats.current;
    const wasOnly = chats.chats.length === 1;
    const at = chats.chats.indexOf(chat);
    if (wasOpen) stop();
    deleteChat(chats, id);
    const filler = wasOnly ? chats.chats[0] : null; // the empty chat that took the last one's place
    if (wasOpen) showChat();
    persist();
    // A mistaken tap on a phone costs nothing: the chat comes back where it was.
    say(`Deleted “${titleOf(chat)}”.`, () => {
      const open = chats.current;
      if (filler && !filler.turns.length && !filler.title) chats.chats = chats.chats.filter((c) => c !== filler);
      chats.chats.splice(Math.min(at, chats.chats.length), 0, chat);
      if (wasOpen || !chats.chats.some((c) => c.id === chats.current)) chats.current = chat.id;
      if (chats.current !== open) {
        stop();
        showChat();
      }
      persist();
    });
  },
  startNew: newChat,
});

// ---- events ----

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const question = input.value.trim();
  if (!question) return;
  input.value = "";
  resizeInput();
  ask(question);
});

input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    form.requestSubmit();
  }
});

function resizeInput() {
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 200)}px`;
}
input.addEventListener("input", resizeInput);

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && live && isLive(live.turn.status)) {
    event.preventDefault();
    stop();
  }
});

stopButton.addEventListener("click", stop);
// A code block's Copy button (render.js makes them; one listener serves every answer).
thread.addEventListener("click", (event) => {
  const button = /** @type {Element} */ (event.target).closest?.(".code-copy");
  const code = button?.closest("figure.code")?.querySelector("pre code");
  if (button && code) copyText(code.textContent ?? "", /** @type {HTMLButtonElement} */ (button));
});
byId("new-chat").addEventListener("click", newChat);
byId("chats-button").addEventListener("click", () => chatList.show(chats));

thread.addEventListener("scroll", () => {
  follow = thread.scrollHeight - thread.scrollTop - thread.clientHeight < 32;
  updateComposer();
});
jumpButton.addEventListener("click", () => {
  follow = true;
  scrollToEnd();
  updateComposer();
});

window.addEventListener("online", () => connection.connect());
// The network went away: the socket is as good as dead (a new network means a new connection), so the answer's
// resume starts as soon as the browser is back online rather than when the dead socket times out.
window.addEventListener("offline", () => connection.abandon());
// Another tab saved its chats: take them, so this tab's next save does not undo that tab's work. The open chat
// stays open (if it still exists), and is redrawn only if its turns changed. While this tab is writing an
// answer it keeps its own list, and its save at the end wins.
window.addEventListener("storage", (event) => {
  if (event.key !== CHATS_KEY || (live && isLive(live.turn.status))) return;
  const fresh = loadChats(localStorage);
  const before = JSON.stringify(state.turns);
  chats.chats = fresh.chats;
  if (!chats.chats.some((c) => c.id === chats.current)) chats.current = fresh.current;
  if (JSON.stringify(currentChat(chats).turns) !== before) showChat();
  else state.turns = currentChat(chats).turns;
  chatList.render(chats);
});
window.addEventListener("pagehide", persist);

/**
 * After a reload: the open chat's last answer, if it was still coming and this tab saved how to resume it, goes
 * back to `streaming` with the text saved beside its progress (so nothing is shown twice); else the saved
 * progress is dropped and an unfinished answer stays `interrupted`.
 * @returns {{turn: Turn, saved: SavedAnswer} | null}
 */
function reloadedAnswer() {
  if (!tabStorage) return null;
  const last = state.turns.at(-1);
  const saved = answerToResume(loadAnswer(tabStorage), chats.current, last);
  if (!saved || !last) {
    clearAnswer(tabStorage);
    return null;
  }
  Object.assign(last, resumeTurn(last, saved.text));
  return { turn: last, saved };
}

// ---- start ----

const reloaded = reloadedAnswer();
showChat();
chatList.render(chats);
persist(); // a conversation kept by an older page moves into the chat list now
connection.start();
if (reloaded) answer(reloaded.turn, reloaded.saved);
input.focus();
