// @ts-check
/**
 * Developer figures measured on the page, as the student lives them: from Send to the first character on screen
 * (a question held while the tutor gets ready counts that wait too), and how fast text arrived once it began.
 * The server's own timings leave out the network, the page and the typing pace, so they are not used here.
 * Pure and DOM-free; the page passes `performance.now()`.
 */

export class AnswerClock {
  /** @param {number} sentAt  when the student sent the question, in milliseconds */
  constructor(sentAt) {
    this.sentAt = sentAt;
    /** @type {number | null} */
    this.shownAt = null;
    /** @type {number | null} */
    this.firstAt = null;
    this.lastAt = 0;
    this.pieces = 0; // text-bearing token messages
    this.chars = 0;
    this.firstChars = 0;
    /** @type {number | null} */
    this.endedAt = null;
  }

  /**
   * A token message's text arrived.
   * @param {string} text
   * @param {number} now
   */
  received(text, now) {
    if (!text) return;
    const chars = [...text].length;
    if (this.firstAt === null) {
      this.firstAt = now;
      this.firstChars = chars;
    }
    this.lastAt = now;
    this.pieces += 1;
    this.chars += chars;
  }

  /**
   * Text reached the screen; only the first time counts.
   * @param {number} now
   */
  shown(now) {
    if (this.shownAt === null) this.shownAt = now;
  }

  /**
   * The chat's last message (its end, or an error) arrived.
   * @param {number} now
   */
  ended(now) {
    if (this.endedAt === null) this.endedAt = now;
  }

  /** The figures in words; "" before anything happened. */
  summary() {
    const parts = [];
    const after = (/** @type {number} */ at) => `${((at - this.sentAt) / 1000).toFixed(2)} s after Send`;
    if (this.shownAt !== null) parts.push(`first character ${after(this.shownAt)}`);
    else if (this.endedAt !== null) parts.push(`no text on screen; ended ${after(this.endedAt)}`);
    const span = this.firstAt === null ? 0 : (this.lastAt - this.firstAt) / 1000;
    if (this.pieces > 1 && span > 0) {
      // After the first piece, which only starts the clock.
      const tokens = (this.pieces - 1) / span;
      const chars = (this.chars - this.firstChars) / span;
      parts.push(`${tokens.toFixed(1)} tokens/s, ${Math.round(chars)} characters/s received`);
    }
    return parts.join(" · ");
  }
}
