// @ts-check
/**
 * Where the formulas are in a line of answer text: `$...$` and `\(...\)` inline, `$$...$$` and `\[...\]`
 * displayed. Pure and DOM-free; inline.js calls `mathAt` before any other inline rule, so a formula's source
 * is never read as emphasis or escapes (`a*b*c` and `\\` mean TeX there, not Markdown).
 *
 * A formula exists only once it is closed. While an answer streams, an opened formula is plain text until its
 * closing delimiter arrives; then the whole of it turns into a formula at once. Single dollars follow
 * Pandoc's rule so that prices are not formulas: the opening `$` is not followed by a space, the closing one
 * is not preceded by a space nor followed by a digit ("from $5 to $10" is text).
 */

/**
 * @typedef {object} MathSpan
 * @property {string} tex      the formula's TeX, without its delimiters
 * @property {boolean} display displayed on a line of its own ($$, \[) rather than inline ($, \()
 * @property {string} source   the formula as written, delimiters included: shown when TeX cannot parse it
 * @property {number} end      the index just after the closing delimiter
 */

/** @type {[open: string, close: string, display: boolean][]} */
const PAIRS = [
  ["$$", "$$", true],
  ["\\[", "\\]", true],
  ["\\(", "\\)", false],
];

/**
 * The formula that opens at `s[i]`, if it opens there and is closed; otherwise null.
 * @param {string} s
 * @param {number} i
 * @returns {MathSpan | null}
 */
export function mathAt(s, i) {
  const c = s[i];
  if (c !== "$" && c !== "\\") return null;
  for (const [open, close, display] of PAIRS) {
    if (!s.startsWith(open, i)) continue;
    const from = i + open.length;
    const at = closingIndex(s, from, close);
    if (at === -1 || !s.slice(from, at).trim()) return null;
    return span(s, i, from, at, at + close.length, display);
  }
  if (c !== "$" || /\s/.test(s[i + 1] ?? " ")) return null;
  for (let j = i + 1; j < s.length; j++) {
    if (s[j] === "\\") j++; // \$ is a dollar sign inside TeX
    else if (s[j] === "$") {
      if (/\s/.test(s[j - 1]) || /\d/.test(s[j + 1] ?? "")) return null;
      return span(s, i, i + 1, j, j + 1, false);
    }
  }
  return null;
}

/**
 * The index of `close` at or after `from`, skipping TeX escapes (so `\\)` is a line break then a paren); -1.
 * @param {string} s
 * @param {number} from
 * @param {string} close
 */
function closingIndex(s, from, close) {
  for (let j = from; j < s.length; j++) {
    if (s.startsWith(close, j)) return j;
    if (s[j] === "\\") j++;
  }
  return -1;
}

/**
 * @param {string} s
 * @param {number} start
 * @param {number} from
 * @param {number} to
 * @param {number} end
 * @param {boolean} display
 * @returns {MathSpan}
 */
function span(s, start, from, to, end, display) {
  return { tex: s.slice(from, to).trim(), display, source: s.slice(start, end), end };
}

/**
 * The opening delimiter of a displayed or bracketed formula at `s[i]` ("$$", "\\[", "\\("), or "". When
 * `mathAt` found no formula there, the caller keeps this as text whole, so the unclosed `$$x$` of an answer
 * still streaming is not read as a dollar sign and then a one-letter formula, and `\(` keeps its backslash.
 * @param {string} s
 * @param {number} i
 */
export function openerAt(s, i) {
  return PAIRS.find(([open]) => s.startsWith(open, i))?.[0] ?? "";
}
