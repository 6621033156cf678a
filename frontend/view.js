// @ts-check
/**
 * The DOM of one turn: the student's question (with Edit, to ask it again differently), the tutor's answer,
 * and the line under it (how it ended, Copy, Regenerate, and with the developer setting the page's figures). Questions are shown as plain text; answers
 * are filled by a Writer.
 */

import { StepTyper } from "./steps.js";
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
   * @param {{copy: (turn: Turn, button: HTMLButtonElement) => void, regenerate: (turn: Turn) => void,
   *   resend: (turn: Turn, question: string) => void}} actions
   * @param {import("./render.js").Extras} [extras]  formulas and code colours for the answer
   * @param {{showStats?: boolean}} [options]  showStats: the developer figures (developer.js)
   */
  constructor(turn, actions, extras = {}, { showStats = false } = {}) {
    this.turn = turn;
    this.showStats = showStats;
    this.root = el("li", "turn");

    this.actions = actions;
    this.question = el("section", "msg user");
    this.bubble = el("p", "bubble", turn.question);
    this.editButton = /** @type {HTMLButtonElement} */ (el("button", "action edit", "Edit"));
    this.editButton.type = "button";
    this.editButton.setAttribute("aria-label", "Edit this question and ask it again");
    this.editButton.addEventListener("click", () => this.startEditing());
    this.question.append(el("h2", "visually-hidden", "You asked"), this.bubble, this.editButton);

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

    this.root.append(this.question, this.article);
    this.writer = new Writer(this.answer, document, undefined, extras);
    this.typer = new StepTyper(this.writer, document);
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
    this.stats.textContent = this.showStats ? stats : ""; // the empty span still keeps the buttons to the right
    this.copyButton.hidden = live || !answer;
    this.regenButton.hidden = live;
    this.regenButton.textContent = status === "failed" || status === "interrupted" ? "Try again" : "Regenerate";
    this.regenButton.setAttribute(
      "aria-label",
      status === "failed" || status === "interrupted" ? "Try again: ask this question again" : "Regenerate: write a new answer to this question",
    );
  }

  /** Swap the question for a box to edit it in; sending it drops this turn's answer and every later turn. */
  startEditing() {
    const form = /** @type {HTMLFormElement} */ (el("form", "edit-form"));
    const box = /** @type {HTMLTextAreaElement} */ (el("textarea", "edit-box"));
    box.value = this.turn.question;
    box.rows = Math.min(8, box.value.split("\n").length + 1);
    box.setAttribute("aria-label", "Your question, edited");
    const send = /** @type {HTMLButtonElement} */ (el("button", "primary", "Send"));
    send.type = "submit";
    send.setAttribute("aria-label", "Send the edited question (later turns are dropped)");
    const cancel = /** @type {HTMLButtonElement} */ (el("button", "quiet", "Cancel"));
    cancel.type = "button";
    const buttons = el("div", "edit-buttons");
    buttons.append(cancel, send);
    form.append(box, buttons);
    const done = () => {
      form.replaceWith(this.bubble);
      this.editButton.hidden = false;
      this.editButton.focus();
    };
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (box.value.trim()) this.actions.resend(this.turn, box.value);
    });
    cancel.addEventListener("click", done);
    box.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.stopPropagation(); // Esc leaves the editor; it does not stop the live answer
        done();
      } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    this.bubble.replaceWith(form);
    this.editButton.hidden = true;
    box.focus();
    box.setSelectionRange(box.value.length, box.value.length);
  }

  /**
   * Show the next piece of the answer's text, with the calculator's steps where they came.
   * @param {string} text
   */
  type(text) {
    this.typer.type(text, this.turn.steps ?? []);
  }

  /** Show a finished answer at once (after a reload). */
  showFinished() {
    this.type(this.turn.answer);
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
