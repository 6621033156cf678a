// @ts-check
/**
 * Code colours for render.js (`Extras.code` and `Extras.label`), over the vendored highlight.js core and the
 * languages a school uses.
 *
 * highlight.js returns HTML, which model text must never become; so its token tree (the `_emitter` of a
 * result, a tree of `{scope, children}` and strings) is walked here into spans with classes and Text nodes.
 * Only class names come from the grammar; every character of the code is a Text node. A language it does not
 * know, or code it cannot colour, is shown plain.
 */

import hljs from "../static/vendor/highlight/core.min.js";
import bash from "../static/vendor/highlight/languages/bash.min.js";
import c from "../static/vendor/highlight/languages/c.min.js";
import cpp from "../static/vendor/highlight/languages/cpp.min.js";
import css from "../static/vendor/highlight/languages/css.min.js";
import java from "../static/vendor/highlight/languages/java.min.js";
import javascript from "../static/vendor/highlight/languages/javascript.min.js";
import json from "../static/vendor/highlight/languages/json.min.js";
import python from "../static/vendor/highlight/languages/python.min.js";
import sql from "../static/vendor/highlight/languages/sql.min.js";
import typescript from "../static/vendor/highlight/languages/typescript.min.js";
import xml from "../static/vendor/highlight/languages/xml.min.js";

/** @typedef {import("./render.js").Doc} Doc */
/** @typedef {string | {scope?: string, children: TokenNode[]}} TokenNode */

const LANGUAGES = { bash, c, cpp, css, java, javascript, json, python, sql, typescript, xml };
for (const [name, grammar] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, grammar);

/** Names for the caption, where highlight.js's own would not do ("HTML, XML"). */
const LABELS = /** @type {Record<string, string>} */ ({
  html: "HTML", xml: "XML", svg: "SVG", sh: "Shell", shell: "Shell", console: "Shell", js: "JavaScript",
  jsx: "JavaScript", ts: "TypeScript", py: "Python", python3: "Python", "c++": "C++", h: "C", sqlite: "SQL",
});

/**
 * The caption for a code block's language: "Python" for ```py, the tag itself when unknown.
 * @param {string} lang
 */
export function languageName(lang) {
  const key = lang.toLowerCase();
  return LABELS[key] ?? hljs.getLanguage(key)?.name ?? lang;
}

/**
 * The code as coloured nodes, or null when the language is unknown.
 * @param {string} text
 * @param {string} lang
 * @param {Doc} [doc]
 * @returns {Node[] | null}
 */
export function highlightCode(text, lang, doc = document) {
  const key = lang.toLowerCase();
  if (!hljs.getLanguage(key)) return null;
  try {
    const result = hljs.highlight(text, { language: key, ignoreIllegals: true });
    const root = /** @type {{scope?: string, children: TokenNode[]}} */ (result._emitter.root);
    return root.children.map((node) => tokenNode(node, doc));
  } catch {
    return null;
  }
}

/**
 * @param {TokenNode} node
 * @param {Doc} doc
 * @returns {Node}
 */
export function tokenNode(node, doc) {
  if (typeof node === "string") return doc.createTextNode(node);
  const span = doc.createElement("span");
  if (node.scope) span.className = scopeClass(node.scope);
  span.append(...node.children.map((child) => tokenNode(child, doc)));
  return span;
}

/**
 * highlight.js's class names for a scope: "title.function" is "hljs-title function_", and a nested
 * language "language:css" is "language-css". Only letters, digits, `_` and `-` survive.
 * @param {string} scope
 */
export function scopeClass(scope) {
  const clean = (/** @type {string} */ s) => s.replace(/[^\w-]/g, "");
  if (scope.startsWith("language:")) return `language-${clean(scope.slice(9))}`;
  const [first, ...rest] = scope.split(".");
  return [`hljs-${clean(first)}`, ...rest.map((piece, i) => `${clean(piece)}${"_".repeat(i + 1)}`)].join(" ");
}
