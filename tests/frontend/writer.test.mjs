import assert from "node:assert/strict";
import { test } from "node:test";

import { parseBlocks } from "../../frontend/markdown.js";
import { Writer } from "../../frontend/writer.js";
import { FakeElement, fakeDocument, html } from "./fake-dom.mjs";

test("text typed in pieces renders as Markdown with the caret at the end", () => {
  const root = new FakeElement("div");
  const writer = new Writer(root, fakeDocument);
  for (const piece of ["Hel", "lo **wor", "ld**"]) writer.feed(piece);
  assert.equal(html(root), '<div><p>Hello <strong>world<span class="caret" aria-hidden="true"></span></strong></p></div>');
  writer.flush();
  assert.equal(html(root), "<div><p>Hello <strong>world</strong></p></div>");
});

test("the caret waits alone before the first character", () => {
  const root = new FakeElement("div");
  new Writer(root, fakeDocument);
  assert.equal(html(root), '<div><span class="caret" aria-hidden="true"></span></div>');
});

test("settled blocks are appended once and kept; only the open block is rebuilt", () => {
  const root = new FakeElement("div");
  const writer = new Writer(root, fakeDocument);
  writer.feed("First paragraph.\n\nSecond");
  writer.feed(" one\n\n");
  writer.feed("Third");
  const first = root.childNodes[0];
  writer.feed(" and more");
  assert.equal(root.childNodes[0], first, "the first paragraph's node was replaced");
  writer.flush();
  assert.equal(html(root), "<div><p>First paragraph.</p><p>Second one</p><p>Third and more</p></div>");
});

test("the caret sits inside an open code block while code streams", () => {
  const root = new FakeElement("div");
  const writer = new Writer(root, fakeDocument);
  writer.feed("```js\nlet x");
  assert.match(html(root), /<code class="language-js">let x<span class="caret"/);
});

test("model text never goes through innerHTML (the fake DOM throws if it does)", () => {
  const root = new FakeElement("div");
  const writer = new Writer(root, fakeDocument);
  writer.feed("<b>bold?</b> <script>alert(1)</script>\n\n```\n<img src=x onerror=alert(1)>\n```");
  writer.flush();
  const tags = [...root.descendants()].map((n) => n.tagName);
  assert.ok(!tags.includes("SCRIPT") && !tags.includes("IMG") && !tags.includes("B"), tags.join());
  assert.match(root.textContent, /<script>alert\(1\)<\/script>/);
});

// ---- typing char by char gives the page it would show for the whole text at once ----

const SAMPLES = {
  paragraphs: "First paragraph,\nwith a line break.\n\nSecond **bold** paragraph.\n\n\nThird after two blanks.",
  headingsAndRules: "# Title\nIntro text.\n## Part *two*\n---\nAfter the rule.\n\n***\n### End ###",
  bulletList: "Steps:\n- one\n- two\n- three\n\nAfter the list.",
  orderedFromThree: "3. three\n4. four\n\nA paragraph.\n\n7. seven\n8) eight with another delimiter",
  looseList: "1. first\n\n2. second\n\n   more of second\n3. third\nlazy line",
  nestedLists: "- outer\n  - inner one\n  - inner two\n    1. deep\n- outer again\n\n  indented paragraph in item\n\nDone.",
  codeFences: "Code:\n```python\ndef f(x):\n\n    return x  # not a *heading*\n```\nAfter.\n~~~\n```not a close\n~~~\n\n````\nunclosed at the end",
  quotes: "> a quote\n> - with a list\n> - of two\n>\n> > nested\nplain after\n\n> second quote",
  mixed: "# Plan\n\n1. Read\n   ```\n   code in item\n   ```\n2. Write\n\n> Note: *done*\n\n---\n\nBye.",
  tables: "Intro line\n| a | b |\n|:-|-:|\n| 1 | **2** |\n\nafter\n| x |\n|---|x\n\nc | d\n--- | ---\n5 | 6",
  windowsLineEnds: "line one\r\nline two\r\n\r\n- item\r\n- item\r\n\r\nend",
};

/** The writer's DOM for `text` typed in pieces, or at once when `pieces` is [text]. */
function written(pieces, { final = true } = {}) {
  const root = new FakeElement("div");
  const writer = new Writer(root, fakeDocument);
  for (const piece of pieces) writer.feed(piece);
  if (final) writer.flush();
  return html(root);
}

for (const [name, sample] of Object.entries(SAMPLES)) {
  test(`typed char by char, ${name} look the same on every frame as rendered at once`, () => {
    const root = new FakeElement("div");
    const writer = new Writer(root, fakeDocument);
    const chars = Array.from(sample);
    for (let i = 0; i < chars.length; i++) {
      writer.feed(chars[i]);
      const typed = chars.slice(0, i + 1).join("");
      assert.equal(html(root), written([typed], { final: false }), `after ${JSON.stringify(typed)}`);
    }
    writer.flush();
    assert.equal(html(root), written([sample]));
  });
}

test("typed in uneven chunks, the finished answer matches the answer rendered at once", () => {
  const all = Object.values(SAMPLES).join("\n\n");
  const chunks = [];
  for (let i = 0, n = 1; i < all.length; i += n, n = (n * 7) % 13 + 1) chunks.push(all.slice(i, i + n));
  assert.equal(written(chunks), written([all]));
});

// ---- the work per frame does not grow with the answer ----

/** Characters handed to the parser while `text` is typed one character per frame. */
function parsedWhileTyping(text) {
  let parsed = 0;
  const parse = (/** @type {string} */ source) => ((parsed += source.length), parseBlocks(source));
  const writer = new Writer(new FakeElement("div"), fakeDocument, parse);
  for (const ch of text) writer.feed(ch);
  writer.flush();
  return parsed;
}

test("a long answer typed char by char is parsed in time linear in its length", () => {
  const paragraph = (i) => `Paragraph ${i} says a little about photosynthesis, then stops.`;
  const answer = (n) => Array.from({ length: n }, (_, i) => paragraph(i)).join("\n\n");
  const short = answer(100);
  const long = answer(200);
  const perChar = parsedWhileTyping(long) / long.length;
  // Each frame parses the open paragraph and at most the one before it.
  assert.ok(perChar < 2 * paragraph(200).length + 2, `${perChar.toFixed(0)} characters parsed per character typed`);
  const growth = parsedWhileTyping(long) / parsedWhileTyping(short);
  assert.ok(growth < 2.2, `twice the answer cost ${growth.toFixed(2)} times the parsing`);
});
