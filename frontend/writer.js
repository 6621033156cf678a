// @ts-check
/**
 * The writer: shows an answer's text as it is typed, rendered as Markdown, with a blinking caret.
 *
 * `feed` appends typed text; `flush` ends the answer and removes the caret. Blocks that can no longer change
 * (see `settledCount`) are appended once and never touched again, so earlier paragraphs stay selectable
 * and cheap. Only the source from the first open block on is parsed again on each frame that adds text:
 * the parser starts every top-level block afresh, so parsing that tail alone gives the same blocks as
 * parsing the whole answer, and the work per frame stays the size of the open block, not of the answer.
 */

import { parseBlocks, settledCount } from "./markdown.js";
import { renderBlock } from "./render.js";

/** @typedef {import("./render.js").Doc} Doc */
/** @typedef {import("./render.js").Extras} Extras */

export class Writer {
  /**
   * @param {Element} root   the answer's container; the writer owns its children
   * @param {Doc} [doc]
   * @param {typeof parseBlocks} [parse]  the block parser; tests pass a counting one
   * @param {Extras} [extras]  formulas and code colours (render.js)
   */
  constructor(root, doc = document, parse = parseBlocks, extras = {}) {
    this.root = root;
    this.doc = doc;
    this.parse = parse;
    this.extras = extras;
    this.source = "";
    /** Where the first block that may still change starts in `source`: always the start of a line. */
    this.openFrom = 0;
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
   * A node of the page's own after the text so far (a calculator step): that text is rendered for good, and what
   * is typed next starts new blocks after the node.
   * @param {Node} node
   */
  insert(node) {
    this.render(true);
    this.root.append(node, this.caret);
  }

  /**
   * @private
   * @param {boolean} final
   */
  render(final) {
    const tail = this.source.slice(this.openFrom);
    const blocks = this.parse(tail);
    const settled = final ? blocks.length : settledCount(blocks, tail);
    this.caret.remove();
    for (const node of this.open) node.parentNode?.removeChild(node);
    for (const block of blocks.slice(0, settled)) this.root.append(renderBlock(block, this.doc, this.extras));
    this.open = blocks.slice(settled).map((b) => renderBlock(b, this.doc, this.extras));
    this.root.append(...this.open);
    if (final) this.openFrom = this.source.length;
    else if (settled > 0) this.openFrom += lineStart(tail, blocks[settled].line);
    if (!final) caretHost(this.root).append(this.caret);
  }
}

/**
 * The offset in `text` where line `line` starts, counting line breaks as the parser does (\n, \r\n, \r).
 * @param {string} text
 * @param {number} line
 */
function lineStart(text, line) {
  const breaks = /\r\n?|\n/g;
  for (let n = 0; n < line; n++) breaks.exec(text);
  return breaks.lastIndex;
}

/**
 * The innermost last element, where the next typed character will appear. A formula is one thing: the caret
 * goes after it, never inside KaTeX's boxes.
 * @param {Element} root
 * @returns {Element}
 */
function caretHost(root) {
  let host = root;
  for (;;) {
    const last = host.lastChild;
    if (!last || last.nodeType !== 1) return host;
    const tag = /** @type {Element} */ (last).tagName;
    if (tag === "BR" || tag === "HR" || /(^|\s)math/.test(/** @type {Element} */ (last).className)) return host;
    host = /** @type {Element} */ (last);
  }
}
