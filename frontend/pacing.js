// @ts-check
/**
 * Typewriter pacing: turns bursty token arrivals into a steady flow of graphemes.
 *
 * Pure and DOM-free: the caller passes the clock (`now`, in milliseconds, as from requestAnimationFrame).
 * Two promises hold: a grapheme is never split (emoji, CJK, combining accents stay whole), and the display
 * never falls more than `maxLagMs` behind the moment the text arrived. Between those bounds the flow is
 * smoothed: each frame shows a share of the backlog, so a burst spreads over about `smoothMs`.
 */

const segmenter = new Intl.Segmenter(undefined, { granularity: "grapheme" });

/**
 * Split text into user-perceived characters.
 * @param {string} text
 * @returns {string[]}
 */
export function graphemes(text) {
  return Array.from(segmenter.segment(text), (s) => s.segment);
}

/**
 * @typedef {object} PacerOptions
 * @property {number} [maxLagMs]   a grapheme is shown at most this long after it arrived
 * @property {number} [smoothMs]   a burst drains over roughly this long
 * @property {number} [minCps]     never type slower than this many graphemes per second while text waits
 * @property {number} [catchUpMs]  after the stream ends, what is left is shown within this long
 */

export class Pacer {
  /** @param {PacerOptions} [options] */
  constructor({ maxLagMs = 300, smoothMs = 120, minCps = 90, catchUpMs = 150 } = {}) {
    this.maxLagMs = maxLagMs;
    this.smoothMs = smoothMs;
    this.minCps = minCps;
    this.catchUpMs = catchUpMs;
    /** @type {{g: string, t: number}[]} graphemes waiting to be shown, in arrival order */
    this.queue = [];
    /** The last grapheme that arrived: the next text may still extend it (a ZWJ emoji, an accent). */
    this.held = "";
    this.heldAt = 0;
    /** Fractional graphemes earned but not yet shown. */
    this.budget = 0;
    /** @type {number | null} */
    this.lastTick = null;
    /** @type {number | null} */
    this.endedAt = null;
  }

  /**
   * Text arrived from the server.
   * @param {string} text
   * @param {number} now
   */
  push(text, now) {
    if (!text) return;
    const parts = graphemes(this.held + text);
    const heldAt = this.held ? this.heldAt : now;
    this.held = /** @type {string} */ (parts.pop());
    this.heldAt = parts.length ? now : heldAt;
    parts.forEach((g, i) => this.queue.push({ g, t: i === 0 ? heldAt : now }));
  }

  /**
   * No more text will arrive: release the held grapheme and catch up promptly.
   * @param {number} now
   */
  end(now) {
    this.releaseHeld();
    this.endedAt = now;
  }

  /** Drop everything not yet shown (the student pressed Stop: the display halts where it is). */
  discard() {
    this.queue = [];
    this.held = "";
    this.budget = 0;
    this.endedAt ??= this.lastTick ?? 0;
  }

  /** Graphemes still to show. */
  get pending() {
    return this.queue.length + (this.held ? 1 : 0);
  }

  /** The stream has ended and everything has been shown. */
  get done() {
    return this.endedAt !== null && this.pending === 0;
  }

  /**
   * The text to show in the frame at `now`.
   * @param {number} now
   * @returns {string}
   */
  take(now) {
    const dt = this.lastTick === null ? 0 : Math.min(Math.max(now - this.lastTick, 0), 1000);
    this.lastTick = now;
    if (this.held && now - this.heldAt >= this.maxLagMs) this.releaseHeld();
    const waiting = this.queue.length;
    if (waiting === 0) {
      this.budget = 0; // no credit saved up while idle, so the next token does not arrive as a burst
      return "";
    }

    let rate = Math.max(this.minCps / 1000, waiting / this.smoothMs); // graphemes per millisecond
    let due = 0; // graphemes past their deadline must go out this frame
    if (this.endedAt !== null) {
      const left = this.endedAt + this.catchUpMs - now;
      if (left <= 0) due = waiting;
      else rate = Math.max(rate, waiting / left);
    }
    while (due < waiting && this.queue[due].t <= now - this.maxLagMs) due++;

    this.budget += rate * dt;
    const n = Math.min(waiting, Math.max(Math.floor(this.budget), due));
    this.budget = Math.max(0, this.budget - n);
    return this.queue
      .splice(0, n)
      .map((x) => x.g)
      .join("");
  }

  /** @private */
  releaseHeld() {
    if (!this.held) return;
    this.queue.push({ g: this.held, t: this.heldAt });
    this.held = "";
  }
}

/**
 * The part of `text` that ends at a word's end: everything up to and including its last run of white space.
 * With `prefers-reduced-motion`, the page shows an answer a whole word at a time rather than letter by letter,
 * and holds the rest back until the word is complete (or the answer is).
 * @param {string} text
 * @returns {string}
 */
export function wholeWords(text) {
  const lastSpace = text.search(/\s\S*$/);
  if (lastSpace === -1) return "";
  return text.slice(0, lastSpace + (/\s+/.exec(text.slice(lastSpace))?.[0].length ?? 1));
}
