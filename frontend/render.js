// @ts-check
/**
 * Turns parsed Markdown into DOM nodes with createElement and createTextNode only.
 *
 * Nothing here assigns markup: model text only ever becomes Text nodes or `textContent`, and the only
 * attribute taken from model text is a link's href after `safeHref` has accepted it. The document is a
 * parameter so tests can render into a small fake one.
 */

import { parseInline } from "./inline.js";

/** @typedef {import("./markdown.js").Block} Block */
/** @typedef {import("./inline.js").Inline} Inline */
/** @typedef {Pick<Document, "createElement" | "createTextNode">} Doc */

/**
 * @param {Block} block
 * @param {Doc} doc
 * @param {boolean} [tight] inside a tight list a paragraph is bare text, without <p>
 * @returns {Node}
 */
export function renderBlock(block, doc, tight = false) {
  switch (block.type) {
    case "paragraph": {
      if (tight) {
        const span = doc.createElement("span");
        span.append(...renderInline(parseInline(block.text), doc));
        return span;
      }
      return el(doc, "p", renderInline(parseInline(block.text), doc));
    }
    case "heading":
      // Answers sit inside the page's own headings, so their levels start below them.
      return el(doc, `h${Math.min(block.level + 2, 6)}`, renderInline(parseInline(block.text), doc));
    case "rule":
      return doc.createElement("hr");
    case "quote":
      return el(doc, "blockquote", block.blocks.map((b) => renderBlock(b, doc)));
    case "list": {
      const list = el(
        doc,
        block.ordered ? "ol" : "ul",
        block.items.map((item) => el(doc, "li", item.map((b) => renderBlock(b, doc, block.tight)))),
      );
      if (block.ordered && block.start !== 1) list.setAttribute("start", String(block.start));
      return list;
    }
    case "table": {
      const row = (/** @type {string[]} */ cells, /** @type {"th" | "td"} */ tag) =>
        el(doc, "tr", cells.map((cell, n) => {
          const node = el(doc, tag, renderInline(parseInline(cell), doc));
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
      if (block.lang) {
        const label = doc.createElement("figcaption");
        label.textContent = block.lang;
        figure.append(label);
      }
      const code = doc.createElement("code");
      if (block.lang) code.className = `language-${block.lang.replace(/[^\w#+-]/g, "")}`;
      code.textContent = block.text;
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
 * @returns {Node[]}
 */
export function renderInline(nodes, doc) {
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
      case "em":
      case "strong":
      case "del":
        return el(doc, node.type, renderInline(node.children, doc));
      case "link": {
        if (node.href === null) {
          return el(doc, "span", renderInline(node.children, doc));
        }
        const a = el(doc, "a", renderInline(node.children, doc));
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
