// @ts-check
/**
 * The writer: shows an answer's text as it is typed, rendered as Markdown, with a blinking caret.
 *
 * `feed` appends typed text; `flush` ends the answer and removes the caret. Blocks that can no longer change
 * (see `settledCount`) are appended once and never touched again, so earlier paragraphs stay selectable
 * and cheap; only the block still being typed is rebuilt, from its source, on each frame that adds text.
 */

import { parseBlocks, settledCount } from "./markdown.js";
import { renderBlock } from "./render.js";

/** @typedef {import("./render.js").Doc} Doc */

export class Writer {
  /**
   * @param {Element} root   the answer's container; the writer owns its children
   * @param {Doc} [doc]
   */
  constructor(root, doc = document) {
    this.root = root;
    this.doc = doc;
    this.source = "";
    /** How many leading blocks are rendered for good. */
    this.settled = 0;
    /** @type {Node[]} nodes of the blocks that may still change */
    this.open = [];
    this.caret = doc.createElement("span");
    this.caret.className = "caret";
    this.caret.setAttribute("aria-hidden", "true");
    root.append(this.caret);
  }

  /** @param {string} text */
  feed(text) {
    if (!text) return;
    this.source += text;
    this.render(false);
  }

  /** The answer is complete (or stopped): render what there is for good and drop the caret. */
  flush() {
    this.render(true);
    this.caret.remove();
  }

  /**
   * @private
   * @param {boolean} final
   */
  render(final) {
    const blocks = parseBlocks(this.source);
    const settled = final ? blocks.length : settledCount(blocks, this.source);
    this.caret.remove();
    for (const node of this.open) node.parentNode?.removeChild(node);
    for (let i = this.settled; i < settled; i++) this.root.append(renderBlock(blocks[i], this.doc));
    this.open = blocks.slice(settled).map((b) => renderBlock(b, this.doc));
    this.root.append(...this.open);
    this.settled = settled;
    if (!final) caretHost(this.root).append(this.caret);
  }
}

/**
 * The innermost last element, where the next typed character will appear.
 * @param {Element} root
 * @returns {Element}
 */
function caretHost(root) {
  let host = root;
  for (;;) {
    const last = host.lastChild;
    if (!last || last.nodeType !== 1) return host;
    const tag = /** @type {Element} */ (last).tagName;
    if (tag === "BR" || tag === "HR") return host;
    host = /** @type {Element} */ (last);
  }
}
