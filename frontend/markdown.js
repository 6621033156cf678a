// @ts-check
/**
 * Block-level Markdown for chat answers: paragraphs, headings, lists, block quotes, rules, fenced code
 * and pipe tables.
 *
 * Pure and DOM-free. The parser reads lines forward and never looks back (a table looks one line ahead, for
 * its delimiter row), so a block that was followed by
 * a new block on a complete line can never change again: the writer renders such blocks once and rebuilds
 * only the open one while the answer streams. There is no raw HTML: `<` is text like any other character.
 * Inline content is kept as source here and parsed by inline.js when rendered.
 */

/**
 * @typedef {{type: "paragraph", text: string}
 *   | {type: "heading", level: number, text: string}
 *   | {type: "code", lang: string, text: string, closed: boolean}
 *   | {type: "list", ordered: boolean, start: number, tight: boolean, items: Block[][]}
 *   | {type: "quote", blocks: Block[]}
 *   | {type: "table", align: Align[], head: string[], rows: string[][]}
 *   | {type: "rule"}} BlockNode
 * @typedef {"left" | "center" | "right" | ""} Align
 * @typedef {BlockNode & {line: number}} Block  `line` is the index of the block's first source line
 */

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;
const TABLE_DELIMITER = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;

/**
 * The cells of a table row: split on pipes that are neither escaped nor inside a code span; the outer
 * pipes are optional. An escaped pipe stays escaped, for the inline parser to unescape.
 * @param {string} line
 * @returns {string[]}
 */
export function tableCells(line) {
  const cells = [];
  let cell = "";
  let code = "";
  const s = line.trim();
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === "\\" && i + 1 < s.length) {
      cell += c + s[++i];
    } else if (c === "`") {
      const run = /^`+/.exec(s.slice(i))?.[0] ?? "`";
      code = code === run ? "" : code || run;
      cell += run;
      i += run.length - 1;
    } else if (c === "|" && !code) {
      cells.push(cell);
      cell = "";
    } else cell += c;
  }
  cells.push(cell);
  if (s.startsWith("|")) cells.shift();
  if (s.endsWith("|") && !s.endsWith("\\|") && cells.length > 1) cells.pop();
  return cells.map((c) => c.trim());
}

/**
 * Does a table start at line i: a header row with a pipe, then a delimiter row with as many cells?
 * @param {string[]} lines
 * @param {number} i
 */
function tableAt(lines, i) {
  const head = lines[i];
  const delimiter = lines[i + 1];
  if (delimiter === undefined || !head.includes("|") || !TABLE_DELIMITER.test(delimiter)) return false;
  return tableCells(head).length === tableCells(delimiter).length;
}

/**
 * @param {string} line
 * @returns {{indent: number, bullet: string, ordered: boolean, start: number, contentIndent: number, text: string} | null}
 */
function listItem(line) {
  const m = ITEM.exec(line);
  if (!m) return null;
  const [, lead, marker, gap = "", text = ""] = m;
  const ordered = /\d/.test(marker[0]);
  const spaces = gap.length > 4 ? 1 : gap.length || 1; // a wide gap means the content is indented code
  return {
    indent: lead.length,
    bullet: ordered ? marker.slice(-1) : marker,
    ordered,
    start: ordered ? parseInt(marker, 10) : 1,
    contentIndent: lead.length + marker.length + spaces,
    text: gap.length > 4 ? gap.slice(1) + text : text,
  };
}

/** @param {string} line */
const isBlank = (line) => line.trim() === "";

/** @param {string} line */
const indentOf = (line) => line.length - line.trimStart().length;

/**
 * Does this line start a block that interrupts a paragraph?
 * @param {string} line
 */
function interruptsParagraph(line) {
  if (FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)) return true;
  const item = listItem(line);
  return item !== null && item.text.trim() !== "";
}

/**
 * Parse Markdown source into blocks.
 * @param {string} source
 * @returns {Block[]}
 */
export function parseBlocks(source) {
  return parseLines(source.replace(/\r\n?/g, "\n").split("\n"));
}

/**
 * @param {string[]} lines
 * @returns {Block[]}
 */
function parseLines(lines) {
  /** @type {Block[]} */
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const start = i;
    if (isBlank(line)) {
      i++;
      continue;
    }

    const fence = FENCE.exec(line);
    if (fence) {
      const [, mark, lang] = fence;
      const indent = indentOf(line);
      const body = [];
      let closed = false;
      for (i++; i < lines.length; i++) {
        const close = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(lines[i]);
        if (close && close[1][0] === mark[0] && close[1].length >= mark.length) {
          closed = true;
          i++;
          break;
        }
        body.push(lines[i].slice(Math.min(indent, indentOf(lines[i]))));
      }
      blocks.push({ type: "code", lang, text: body.join("\n"), closed, line: start });
      continue;
    }

    const heading = HEADING.exec(line);
    if (heading) {
      blocks.push({ type: "heading", level: heading[1].length, text: heading[2] ?? "", line: start });
      i++;
      continue;
    }

    if (RULE.test(line)) {
      blocks.push({ type: "rule", line: start });
      i++;
      continue;
    }

    if (QUOTE.test(line)) {
      const inner = [];
      for (let m; i < lines.length && (m = QUOTE.exec(lines[i])); i++) inner.push(m[1]);
      blocks.push({ type: "quote", blocks: parseLines(inner), line: start });
      continue;
    }

    if (tableAt(lines, i)) {
      const head = tableCells(line);
      /** @type {Align[]} */
      const align = tableCells(lines[i + 1]).map((d) =>
        d.startsWith(":") && d.endsWith(":") ? "center" : d.endsWith(":") ? "right" : d.startsWith(":") ? "left" : "",
      );
      const rows = [];
      for (i += 2; i < lines.length && !isBlank(lines[i]) && !interruptsParagraph(lines[i]); i++) {
        const cells = tableCells(lines[i]);
        rows.push(head.map((_, n) => cells[n] ?? "")); // every row has the header's width
      }
      blocks.push({ type: "table", align, head, rows, line: start });
      continue;
    }

    const first = listItem(line);
    if (first) {
      const list = { ordered: first.ordered, start: first.start, tight: true, items: /** @type {Block[][]} */ ([]) };
      let item = first;
      let blankBefore = false;
      while (item) {
        // Gather the item's own lines: its first line, indented continuations, and lazy paragraph lines.
        const body = [item.text];
        let blankInside = false;
        for (i++; i < lines.length; i++) {
          const next = lines[i];
          if (isBlank(next)) {
            body.push("");
            continue;
          }
          const trailingBlank = body[body.length - 1] === "";
          const nested = indentOf(next) > item.indent + 1 && listItem(next) !== null;
          if (indentOf(next) >= item.contentIndent || nested) {
            if (trailingBlank) blankInside = true;
            body.push(next.slice(Math.min(item.contentIndent, indentOf(next))));
          } else if (!trailingBlank && !listItem(next) && !interruptsParagraph(next)) {
            body.push(next.trim()); // a lazy continuation of the item's paragraph
          } else break;
        }
        let trailing = 0;
        while (body.length > 1 && body[body.length - 1] === "") body.pop(), trailing++;
        if (blankBefore || blankInside) list.tight = false;
        list.items.push(parseLines(body));

        const next = i < lines.length ? listItem(lines[i]) : null;
        const sameList = next && next.ordered === first.ordered && next.bullet === first.bullet;
        if (!sameList || !next) break;
        blankBefore = trailing > 0;
        item = next;
      }
      blocks.push({ type: "list", ...list, line: start });
      continue;
    }

    const text = [line.trim()];
    for (i++; i < lines.length && !isBlank(lines[i]) && !interruptsParagraph(lines[i]) && !tableAt(lines, i); i++) {
      text.push(lines[i].trim());
    }
    blocks.push({ type: "paragraph", text: text.join("\n"), line: start });
  }
  return blocks;
}

/**
 * How many leading blocks are final: no text appended to `source` can change them.
 * A block is final once the block after it starts on a complete line (one ended by a newline); for a table,
 * once its delimiter row is complete too.
 * @param {Block[]} blocks
 * @param {string} source
 */
export function settledCount(blocks, source) {
  const lastLine = source.split("\n").length - 1; // the partial line still being typed
  // A table exists only once its delimiter row (its second line) is complete: until then the block before
  // it may still take its header row back as a line of its own.
  const confirmed = (/** @type {Block} */ b) => b.line + (b.type === "table" ? 1 : 0) < lastLine;
  let n = 0;
  while (n + 1 < blocks.length && confirmed(blocks[n + 1])) n++;
  return n;
}
