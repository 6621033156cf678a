// @ts-check
/**
 * Inline Markdown: formulas, code spans, emphasis, strikethrough, links, autolinks and line breaks.
 *
 * Pure and DOM-free; produces a small tree that render.js turns into elements and Text nodes. Raw HTML is
 * not a thing here: `<script>` is seven characters of text. A link keeps its target only if `safeHref`
 * accepts it; otherwise the link text stays and the target is dropped. Formulas are found first (math.js), so
 * TeX inside them is never read as Markdown.
 */

import { mathAt, openerAt } from "./math.js";

/**
 * @typedef {{type: "text", value: string}
 *   | {type: "code", value: string}
 *   | {type: "math", tex: string, display: boolean, source: string}
 *   | {type: "break"}
 *   | {type: "em" | "strong" | "del", children: Inline[]}
 *   | {type: "link", href: string | null, children: Inline[]}} Inline
 */

const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);
const PUNCTUATION = /[!-/:-@[-`{-~]/;
const URL_AT = /^https?:\/\/[^\s<>"]*[^\s<>".,:;!?')\]*_~]/;

/**
 * The link target to use, or null when it is not an absolute http(s) or mailto URL.
 * Parsing with URL strips the tabs, newlines and case tricks ("JaVa\tscript:") the way a browser would.
 * @param {string} raw
 * @returns {string | null}
 */
export function safeHref(raw) {
  try {
    const url = new URL(raw.trim());
    return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

/**
 * Index of the closing delimiter `delim` at or after `from`, skipping escapes and code spans; -1 if none.
 * A closer must follow a non-space; an underscore closer must not be inside a word.
 * @param {string} s
 * @param {number} from
 * @param {string} delim
 */
function findCloser(s, from, delim) {
  for (let i = from; i < s.length; i++) {
    const c = s[i];
    const math = mathAt(s, i);
    if (math) {
      i = math.end - 1; // a delimiter inside a formula is TeX
    } else if (c === "\\") {
      i++;
    } else if (c === "`") {
      const run = /^`+/.exec(s.slice(i))?.[0] ?? "`";
      const end = s.indexOf(run, i + run.length);
      if (end !== -1) i = end + run.length - 1;
      else i += run.length - 1;
    } else if (c === delim[0]) {
      let end = i;
      while (s[end] === c) end++;
      const after = s[end] ?? "";
      const closes = end - i === delim.length && i > from && !/\s/.test(s[i - 1]);
      i = end - 1; // a run of another length is skipped whole: it belongs to some other pair
      if (!closes || (c === "_" && /\w/.test(after))) continue;
      return end - delim.length;
    }
  }
  return -1;
}

/**
 * Parse inline Markdown.
 * @param {string} s
 * @param {boolean} [inLink] links do not nest
 * @returns {Inline[]}
 */
export function parseInline(s, inLink = false) {
  /** @type {Inline[]} */
  const out = [];
  let text = "";
  const flush = () => {
    if (text) out.push({ type: "text", value: text });
    text = "";
  };

  for (let i = 0; i < s.length; ) {
    const c = s[i];
    const rest = s.slice(i);

    const math = mathAt(s, i);
    if (math) {
      flush();
      out.push({ type: "math", tex: math.tex, display: math.display, source: math.source });
      i = math.end;
      continue;
    }
    const opener = openerAt(s, i); // an unclosed one: text, whole
    if (opener) {
      text += opener;
      i += opener.length;
      continue;
    }
    if (c === "\\" && PUNCTUATION.test(s[i + 1] ?? "")) {
      text += s[i + 1];
      i += 2;
      continue;
    }
    if (c === "\n") {
      flush();
      out.push({ type: "break" });
      i++;
      continue;
    }
    if (c === "`") {
      const run = /^`+/.exec(rest)?.[0] ?? "`";
      const end = s.indexOf(run, i + run.length);
      if (end !== -1 && s[end + run.length] !== "`") {
        flush();
        let value = s.slice(i + run.length, end).replace(/\n/g, " ");
        if (/^ .*\S.* $/.test(value)) value = value.slice(1, -1);
        out.push({ type: "code", value });
        i = end + run.length;
      } else {
        text += run;
        i += run.length;
      }
      continue;
    }
    if (c === "*" || c === "_" || c === "~") {
      const run = new RegExp(`^\\${c}+`).exec(rest)?.[0] ?? c;
      const opensWord = !/\s/.test(s[i + run.length] ?? " ");
      const intraword = c === "_" && /\w/.test(s[i - 1] ?? "");
      const tries = c === "~" ? (run.length === 2 ? [2] : []) : run.length >= 3 ? [3, 2, 1] : run.length === 2 ? [2, 1] : [1];
      let matched = false;
      for (const n of opensWord && !intraword ? tries : []) {
        const end = findCloser(s, i + n, c.repeat(n));
        if (end === -1) continue;
        flush();
        const children = parseInline(s.slice(i + n, end), inLink);
        /** @type {Inline} */
        const node =
          c === "~" ? { type: "del", children }
          : n === 3 ? { type: "strong", children: [{ type: "em", children }] }
          : { type: n === 2 ? "strong" : "em", children };
        out.push(node);
        i = end + n;
        matched = true;
        break;
      }
      if (!matched) {
        text += run;
        i += run.length;
      }
      continue;
    }
    if (!inLink && (c === "[" || (c === "!" && s[i + 1] === "["))) {
      const link = /^!?\[((?:[^\[\]\\]|\\.)*)\]\(\s*<?([^\s<>()]*(?:\([^\s()]*\)[^\s<>()]*)*)>?(?:\s+"[^"]*")?\s*\)/.exec(rest);
      if (link) {
        flush();
        const label = link[1] || link[2];
        out.push({ type: "link", href: safeHref(link[2]), children: parseInline(label, true) });
        i += link[0].length;
        continue;
      }
    }
    if (!inLink && c === "<") {
      const auto = /^<((?:https?|mailto):[^\s<>]+)>/i.exec(rest);
      if (auto) {
        flush();
        out.push({ type: "link", href: safeHref(auto[1]), children: [{ type: "text", value: auto[1] }] });
        i += auto[0].length;
        continue;
      }
    }
    if (!inLink && c === "h" && !/\w/.test(s[i - 1] ?? "")) {
      const url = URL_AT.exec(rest);
      if (url) {
        flush();
        out.push({ type: "link", href: safeHref(url[0]), children: [{ type: "text", value: url[0] }] });
        i += url[0].length;
        continue;
      }
    }
    text += c;
    i++;
  }
  flush();
  return out;
}
