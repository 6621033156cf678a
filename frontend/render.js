// @ts-check
/**
 * Turns parsed Markdown into DOM nodes with createElement and createTextNode only.
 *
 * Nothing here assigns markup: model text only ever becomes Text nodes or `textContent`, and the only
 * attribute taken from model text is a link's href after `safeHref` has accepted it. The document is a
 * parameter so tests can render into a small fake one.
 *
 * Formulas and code colours come from `Extras` the page passes in (formula.js over KaTeX, code.js over
 * highlight.js), which build their nodes the same way. Without them a formula shows as its source and code
 * as plain text, which is also what they fall back to.
 */

import { parseInline } from "./inline.js";

/** @typedef {import("./markdown.js").Block} Block */
/** @typedef {import("./inline.js").Inline} Inline */
/** @typedef {Pick<Document, "createElement" | "createTextNode">} Doc */
/**
 * @typedef {object} Extras
 * @property {(math: {tex: string, display: boolean, source: string}, doc: Doc) => Node} [math]
 * @property {(text: string, lang: string, doc: Doc) => Node[] | null} [code]  coloured code, or null
 * @property {(lang: string) => string} [label]  the language's name for a code block's caption
 */

/**
 * @param {Block} block
 * @param {Doc} doc
 * @param {Extras} [extras]
 * @param {boolean} [tight] inside a tight list a paragraph is bare text, without <p>
 * @returns {Node}
 */
export function renderBlock(block, doc, extras = {}, tight = false) {
  const inline = (/** @type {string} */ text) => renderInline(parseInline(text), doc, extras);
  switch (block.type) {
    case "paragraph": {
      if (tight) {
        const span = doc.createElement("span");
        span.append(...inline(block.text));
        return span;
      }
      return el(doc, "p", inline(block.text));
    }
    case "heading":
      // Answers sit inside the page's own headings, so their levels start below them.
      return el(doc, `h${Math.min(block.level + 2, 6)}`, inline(block.text));
    case "rule":
      return doc.createElement("hr");
    case "quote":
      return el(doc, "blockquote", block.blocks.map((b) => renderBlock(b, doc, extras)));
    case "list": {
      const list = el(
        doc,
        block.ordered ? "ol" : "ul",
        block.items.map((item) => el(doc, "li", item.map((b) => renderBlock(b, doc, extras, block.tight)))),
      );
      if (block.ordered && block.start !== 1) list.setAttribute("start", String(block.start));
      return list;
    }
    case "table": {
      const row = (/** @type {string[]} */ cells, /** @type {"th" | "td"} */ tag) =>
        el(doc, "tr", cells.map((cell, n) => {
          const node = el(doc, tag, inline(cell));
          if (block.align[n]) node.className = `align-${block.align[n]}`; // a class: the CSP allows no style attribute
          if (tag === "th") node.setAttribute("scope", "col");
          return node;
        }));
      const table = el(doc, "table", [
        el(doc, "thead", [row(block.head, "th")]),
        ...(block.rows.length ? [el(doc, "tbody", block.rows.map((r) => row(r, "td")))] : []),
      ]);
      // A wide table scrolls sideways inside its own box, never the page; keyboard users can scroll it too.
      const box = el(doc, "div", [table]);
      box.className = "table-scroll";
      box.setAttribute("tabindex", "0");
      box.setAttribute("role", "region");
      box.setAttribute("aria-label", "Table");
      return box;
    }
    case "code": {
      const figure = doc.createElement("figure");
      figure.className = "code";
      const caption = doc.createElement("figcaption");
      const label = doc.createElement("span");
      label.className = "code-lang";
      label.textContent = block.lang ? (extras.label?.(block.lang) ?? block.lang) : "";
      // The page copies the code of the figure whose button was pressed (one listener for the thread).
      const copy = doc.createElement("button");
      copy.className = "code-copy";
      copy.setAttribute("type", "button");
      copy.setAttribute("aria-label", block.lang ? `Copy the ${label.textContent} code` : "Copy the code");
      copy.textContent = "Copy";
      caption.append(label, copy);
      figure.append(caption);
      const code = doc.createElement("code");
      if (block.lang) code.className = `language-${block.lang.replace(/[^\w#+-]/g, "")}`;
      const coloured = block.lang ? extras.code?.(block.text, block.lang, doc) : null;
      if (coloured) code.append(...coloured);
      else code.textContent = block.text;
      const pre = doc.createElement("pre");
      pre.tabIndex = 0; // a wide block scrolls sideways; let keyboard users do that too
      pre.append(code);
      figure.append(pre);
      return figure;
    }
  }
}

/**
 * @param {Inline[]} nodes
 * @param {Doc} doc
 * @param {Extras} [extras]
 * @returns {Node[]}
 */
export function renderInline(nodes, doc, extras = {}) {
  return nodes.map((node) => {
    switch (node.type) {
      case "text":
        return doc.createTextNode(node.value);
      case "break":
        return doc.createElement("br");
      case "code": {
        const code = doc.createElement("code");
        code.textContent = node.value;
        return code;
      }
      case "math": {
        if (extras.math) return extras.math(node, doc);
        const source = doc.createElement("span");
        source.className = "math-source";
        source.textContent = node.source;
        return source;
      }
      case "em":
      case "strong":
      case "del":
        return el(doc, node.type, renderInline(node.children, doc, extras));
      case "link": {
        if (node.href === null) {
          return el(doc, "span", renderInline(node.children, doc, extras));
        }
        const a = el(doc, "a", renderInline(node.children, doc, extras));
        a.setAttribute("href", node.href);
        a.setAttribute("rel", "noopener noreferrer nofollow");
        a.setAttribute("target", "_blank");
        return a;
      }
    }
  });
}

/**
 * @param {Doc} doc
 * @param {string} tag
 * @param {Node[]} children
 */
function el(doc, tag, children) {
  const node = doc.createElement(tag);
  node.append(...children);
  return node;
}
