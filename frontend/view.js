// @ts-check
/**
 * The DOM of one turn: the student's question, the tutor's answer, and the line under it (how it ended,
 * stats, Copy, Regenerate). Questions are shown as plain text; answers are filled by a Writer.
 */

import { Writer } from "./writer.js";

/** @typedef {import("./state.js").Turn} Turn */

/**
 * @param {string} tag
 * @param {string} className
 * @param {string} [text]
 */
function el(tag, className, text) {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export class TurnView {
  /**
   * @param {Turn} turn
   * @param {{copy: (turn: Turn, button: HTMLButtonElement) => void, regenerate: (turn: Turn) => void}} actions
   * @param {import("./render.js").Extras} [extras]  formulas and code colours for the answer
   */
  constructor(turn, actions, extras = {}) {
    this.turn = turn;
    this.root = el("li", "turn");

    const question = el("section", "msg user");
    question.append(el("h2", "visually-hidden", "You asked"), el("p", "bubble", turn.question));

    this.article = el("article", "msg tutor");
    this.answer = el("div", "answer md");
    this.note = el("p", "note");
    this.stats = el("span", "stats");
    this.copyButton = /** @type {HTMLButtonElement} */ (el("button", "action", "Copy"));
    this.copyButton.type = "button";
    this.copyButton.setAttribute("aria-label", "Copy this answer");
    this.copyButton.addEventListener("click", () => actions.copy(this.turn, this.copyButton));
    this.regenButton = /** @type {HTMLButtonElement} */ (el("button", "action regen", "Regenerate"));
    this.regenButton.type = "button";
    this.regenButton.addEventListener("click", () => actions.regenerate(this.turn));
    const meta = el("footer", "meta");
    meta.append(this.stats, this.copyButton, this.regenButton);
    this.article.append(el("h2", "visually-hidden", "Tutor answered"), this.answer, this.note, meta);

    this.root.append(question, this.article);
    this.writer = new Writer(this.answer, document, undefined, extras);
    /** The display is still catching up; it may outlast the answer's arrival by a few frames. */
    this.typing = true;
    this.update();
  }

  /** Reflect the turn's status, note and stats; called whenever they change. */
  update() {
    const { status, note, stats, answer } = this.turn;
    const live = status === "waiting" || status === "queued" || status === "streaming";
    this.article.dataset.status = status;
    this.article.setAttribute("aria-busy", String(live || this.typing));
    this.note.textContent = note;
    this.note.hidden = !note;
    this.note.setAttribute("role", status === "failed" ? "alert" : "none");
    this.stats.textContent = stats;
    this.copyButton.hidden = live || !answer;
    this.regenButton.hidden = live;
    this.regenButton.textContent = status === "failed" || status === "interrupted" ? "Try again" : "Regenerate";
    this.regenButton.setAttribute(
      "aria-label",
      status === "failed" || status === "interrupted" ? "Ask this question again" : "Write a new answer to this question",
    );
  }

  /** Show a finished answer at once (after a reload). */
  showFinished() {
    this.writer.feed(this.turn.answer);
    this.finishTyping();
  }

  /** The last character is on screen: drop the caret and let assistive technology read the answer. */
  finishTyping() {
    this.writer.flush();
    this.typing = false;
    this.update();
  }

  /**
   * Only the last turn offers Regenerate.
   * @param {boolean} value
   */
  set isLast(value) {
    this.root.classList.toggle("last", value);
  }
}
