// @ts-check
/**
 * The chat list: a modal dialog (templates/index.html, `#chats`) with one row per kept chat, newest first:
 * open it, rename it, delete it, or start a new one. The rows are rebuilt from the list (chats.js) whenever
 * it changes; titles are Text nodes like everything else the student or the model wrote.
 */

import { titleOf } from "./chats.js";

/** @typedef {import("./chats.js").ChatList} Chats */
/**
 * @typedef {object} ChatListActions
 * @property {(id: string) => void} open
 * @property {(id: string, title: string) => void} rename
 * @property {(id: string) => void} remove
 * @property {() => void} startNew
 */

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

/** @param {string} className @param {string} text @param {string} label */
function button(className, text, label) {
  const b = /** @type {HTMLButtonElement} */ (el("button", className, text));
  b.type = "button";
  b.setAttribute("aria-label", label);
  return b;
}

export class ChatList {
  /**
   * @param {HTMLElement} dialog  a <dialog> holding `.chat-items`, `.chats-new` and `.chats-close`
   * @param {ChatListActions} actions
   */
  constructor(dialog, actions) {
    this.dialog = /** @type {HTMLDialogElement} */ (dialog);
    this.actions = actions;
    this.items = /** @type {HTMLElement} */ (dialog.querySelector(".chat-items"));
    /** The id of the chat being renamed, if any: Esc then cancels the rename, not the dialog. */
    this.renaming = "";
    /** @type {Chats | null} */
    this.list = null;
    dialog.querySelector(".chats-close")?.addEventListener("click", () => this.dialog.close());
    dialog.querySelector(".chats-new")?.addEventListener("click", () => {
      this.dialog.close();
      actions.startNew();
    });
    dialog.addEventListener("cancel", (event) => {
      if (!this.renaming) return;
      event.preventDefault();
      this.renaming = "";
      if (this.list) this.render(this.list);
    });
    // A click on the backdrop (outside the panel) closes it, as on most phones' sheets.
    dialog.addEventListener("click", (event) => {
      if (event.target === dialog) this.dialog.close();
    });
  }

  /** @param {Chats} list */
  show(list) {
    this.render(list);
    this.dialog.showModal();
    /** @type {HTMLElement | null} */ (this.items.querySelector("[aria-current=true]"))?.focus();
  }

  /** @param {Chats} list */
  render(list) {
    this.list = list;
    this.items.replaceChildren(...list.chats.map((chat) => this.row(chat, chat.id === list.current)));
  }

  /**
   * @private
   * @param {import("./chats.js").Chat} chat
   * @param {boolean} open
   */
  row(chat, open) {
    const title = titleOf(chat);
    const li = el("li", "chat-item");
    li.dataset.id = chat.id;
    const questions = chat.turns.length;
    if (this.renaming === chat.id) {
      const form = el("form", "chat-rename-form");
      const input = /** @type {HTMLInputElement} */ (el("input", "chat-title-input"));
      input.value = chat.title || titleOf(chat);
      input.maxLength = 200;
      input.setAttribute("aria-label", "New name for this chat");
      const save = /** @type {HTMLButtonElement} */ (el("button", "primary", "Save"));
      save.type = "submit";
      form.append(input, save);
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        this.renaming = "";
        this.actions.rename(chat.id, input.value);
        /** @type {HTMLElement | null} */ (this.items.querySelector(`[data-id="${CSS.escape(chat.id)}"] .chat-rename`))?.focus();
      });
      li.append(form);
      queueMicrotask(() => {
        input.focus();
        input.select();
      });
      return li;
    }
    const opener = button("chat-open", "", `${title}, ${questions === 1 ? "1 question" : `${questions} questions`}${open ? ", open now" : ""}`);
    opener.append(el("span", "chat-title", title), el("span", "chat-count", questions === 1 ? "1 question" : `${questions} questions`));
    if (open) opener.setAttribute("aria-current", "true");
    opener.addEventListener("click", () => {
      this.dialog.close();
      this.actions.open(chat.id);
    });
    const rename = button("action chat-rename", "Rename", `Rename “${title}”`);
    rename.addEventListener("click", () => {
      this.renaming = chat.id;
      this.render(/** @type {Chats} */ (this.list));
    });
    const remove = button("action chat-delete", "Delete", `Delete “${title}”`);
    remove.addEventListener("click", () => {
      const next = li.nextElementSibling ?? li.previousElementSibling;
      const nextId = /** @type {HTMLElement | null} */ (next)?.dataset.id;
      this.actions.remove(chat.id);
      const focus = nextId && this.items.querySelector(`[data-id="${CSS.escape(nextId)}"] .chat-open`);
      /** @type {HTMLElement} */ (focus || this.dialog.querySelector(".chats-new"))?.focus();
    });
    li.append(opener, rename, remove);
    return li;
  }
}
