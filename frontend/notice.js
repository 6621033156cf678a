// @ts-check
/**
 * The quiet notice above the composer (`#notice`): chats removed to make room, a deleted chat with Undo.
 * It stays until dismissed or replaced.
 */

export class Notice {
  /** @param {HTMLElement} bar  holds `#notice-text`, `#notice-undo` and `#notice-close` */
  constructor(bar) {
    this.bar = bar;
    this.text = /** @type {HTMLElement} */ (bar.querySelector("#notice-text"));
    this.undoButton = /** @type {HTMLButtonElement} */ (bar.querySelector("#notice-undo"));
    /** @type {(() => void) | null} */
    this.undo = null;
    bar.querySelector("#notice-close")?.addEventListener("click", () => this.say(""));
    this.undoButton.addEventListener("click", () => {
      const action = this.undo;
      this.say("");
      action?.();
    });
  }

  /**
   * @param {string} text  "" hides the notice
   * @param {(() => void) | null} [onUndo]  offers Undo, which runs this
   */
  say(text, onUndo = null) {
    this.text.textContent = text;
    this.bar.hidden = !text;
    this.undo = onUndo;
    this.undoButton.hidden = !onUndo;
  }
}
