import assert from "node:assert/strict";
import { test } from "node:test";

import { parseInline, safeHref } from "../../frontend/inline.js";
import { parseBlocks, settledCount } from "../../frontend/markdown.js";
import { renderBlock } from "../../frontend/render.js";
import { fakeDocument, html } from "./fake-dom.mjs";

/** Render Markdown to an HTML string through the real renderer and the fake DOM. */
const md = (source) => parseBlocks(source).map((b) => html(renderBlock(b, fakeDocument))).join("");
const types = (source) => parseBlocks(source).map((b) => b.type);

// ---- safety ----

test("a script tag in an answer is shown as text", () => {
  const out = md("Try this: <script>alert(1)</script>");
  assert.equal(out, "<p>Try this: &lt;script&gt;alert(1)&lt;/script&gt;</p>");
});

test("an img with onerror is shown as text, in prose and in code", () => {
  assert.equal(md('<img src=x onerror="alert(1)">'), "<p>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</p>");
  const code = md("```html\n<img src=x onerror=alert(1)>\n```");
  assert.match(code, /<code class="language-html">&lt;img src=x onerror=alert\(1\)&gt;<\/code>/);
});

test("javascript: and other unsafe link targets are dropped, the link text stays", () => {
  for (const target of ["javascript:alert(1)", "JaVaScRiPt:alert(1)", "java\tscript:alert(1)", "data:text/html,<b>x</b>", "vbscript:x", "/relative", "#top"]) {
    const out = md(`[click me](${target})`);
    assert.ok(!out.includes("href"), `${target} kept: ${out}`);
    assert.ok(out.includes("click me"), out);
  }
  assert.equal(safeHref(" javascript:alert(1)"), null);
  assert.equal(safeHref("https://example.org/a?b=1"), "https://example.org/a?b=1");
});

test("safe links open in a new tab without an opener", () => {
  assert.equal(
    md("See [the docs](https://example.org/x)."),
    '<p>See <a href="https://example.org/x" rel="noopener noreferrer nofollow" target="_blank">the docs</a>.</p>',
  );
});

test("images are never loaded: they become links with their alt text", () => {
  const out = md("![a cat](https://example.org/cat.png)");
  assert.ok(!out.includes("<img"), out);
  assert.match(out, /<a href="https:\/\/example.org\/cat.png"[^>]*>a cat<\/a>/);
});

test("a language label cannot smuggle markup or attributes", () => {
  const out = md('```"><script>x\ncode\n```');
  assert.ok(!out.includes("<script>"), out);
});

// ---- blocks ----

test("paragraphs split on blank lines; single newlines are line breaks", () => {
  assert.equal(md("one\ntwo\n\nthree"), "<p>one<br>two</p><p>three</p>".replace("<br>", "<br></br>"));
});

test("bullet and numbered lists, tight and loose, with nesting", () => {
  assert.equal(md("- a\n- b"), "<ul><li><span>a</span></li><li><span>b</span></li></ul>");
  assert.equal(md("3. x\n4. y"), '<ol start="3"><li><span>x</span></li><li><span>y</span></li></ol>');
  assert.equal(md("- a\n\n- b"), "<ul><li><p>a</p></li><li><p>b</p></li></ul>");
  assert.equal(md("1. a\n   - b\n2. c"), "<ol><li><span>a</span><ul><li><span>b</span></li></ul></li><li><span>c</span></li></ol>");
});

test("a list interrupts a paragraph, as models write them", () => {
  assert.deepEqual(types("Steps:\n1. read\n2. write"), ["paragraph", "list"]);
});

test("fenced code keeps its text verbatim and shows its language", () => {
  const out = md("```python\ndef f(x):\n    return x * 2  # *not emphasis*\n```");
  assert.equal(
    out,
    '<figure class="code"><figcaption><span class="code-lang">python</span>' +
      '<button class="code-copy" type="button" aria-label="Copy the python code">Copy</button></figcaption><pre><code class="language-python">def f(x):\n    return x * 2  # *not emphasis*</code></pre></figure>',
  );
});

test("an unclosed fence runs to the end, as while it streams", () => {
  const [block] = parseBlocks("```js\nlet a = 1;\n");
  assert.equal(block.type, "code");
  assert.equal(block.closed, false);
  assert.equal(block.text, "let a = 1;\n");
});

test("headings, quotes and rules", () => {
  assert.deepEqual(types("# Title\n> quoted\n\n---\ntext"), ["heading", "quote", "rule", "paragraph"]);
  assert.equal(md("## Step 2"), "<h4>Step 2</h4>");
  assert.equal(md("#hashtag"), "<p>#hashtag</p>");
});

// ---- inline ----

test("emphasis, strong, strikethrough and inline code", () => {
  assert.equal(md("*a* **b** ***c*** ~~d~~ `e*f*`"), "<p><em>a</em> <strong>b</strong> <strong><em>c</em></strong> <del>d</del> <code>e*f*</code></p>");
  assert.equal(md("*a **b** c*"), "<p><em>a <strong>b</strong> c</em></p>");
});

test("underscores inside words and lone stars stay literal", () => {
  assert.equal(md("snake_case_name and 2 * 3 * 4"), "<p>snake_case_name and 2 * 3 * 4</p>");
  assert.equal(md("_yes_"), "<p><em>yes</em></p>");
});

test("backslash escapes and bare URLs", () => {
  assert.equal(md("\\*not\\*"), "<p>*not*</p>");
  assert.deepEqual(parseInline("see https://example.org/a."), [
    { type: "text", value: "see " },
    { type: "link", href: "https://example.org/a", children: [{ type: "text", value: "https://example.org/a" }] },
    { type: "text", value: "." },
  ]);
});

// ---- streaming ----

test("blocks before one that starts on a complete line are settled", () => {
  const source = "First.\n\nSecond\n\nThird\n- a";
  const blocks = parseBlocks(source);
  assert.equal(blocks.length, 4);
  assert.equal(settledCount(blocks, source), 2); // "Third" is followed only by the line being typed
  // A partial last line could still turn into a different block, so what precedes it stays open.
  const partial = "First.\n\n-";
  assert.equal(settledCount(parseBlocks(partial), partial), 0);
});

test("settled blocks never change as more text streams in", () => {
  const answer = "Intro with *emphasis*.\n\n1. one\n2. two\n\n```py\nprint(1)\n```\n\n> note\n\nBye **now**.";
  let settled = [];
  for (let i = 1; i <= answer.length; i++) {
    const prefix = answer.slice(0, i);
    const blocks = parseBlocks(prefix);
    const n = settledCount(blocks, prefix);
    const rendered = blocks.slice(0, n).map((b) => html(renderBlock(b, fakeDocument)));
    assert.deepEqual(rendered.slice(0, settled.length), settled, `changed at ${JSON.stringify(prefix)}`);
    settled = rendered;
  }
  const full = parseBlocks(answer).map((b) => html(renderBlock(b, fakeDocument)));
  assert.deepEqual(full.slice(0, settled.length), settled);
});

// ---- tables ----

test("a pipe table becomes a table in a box that scrolls on its own, with aligned columns", () => {
  const out = md("| Name | Mass |\n|:--|--:|\n| H | 1.008 |\n| He | `4|0` \\| x |\n\nAfter.");
  assert.equal(
    out,
    '<div class="table-scroll" tabindex="0" role="region" aria-label="Table"><table>' +
      '<thead><tr><th class="align-left" scope="col">Name</th><th class="align-right" scope="col">Mass</th></tr></thead>' +
      '<tbody><tr><td class="align-left">H</td><td class="align-right">1.008</td></tr>' +
      '<tr><td class="align-left">He</td><td class="align-right"><code>4|0</code> | x</td></tr></tbody>' +
      "</table></div><p>After.</p>",
  );
});

test("a table interrupts a paragraph; rows get the header's width; a delimiter of another width is text", () => {
  assert.deepEqual(types("Intro\na | b\n--- | ---\n1 | 2 | 3\n4"), ["paragraph", "table"]);
  assert.deepEqual(parseBlocks("a | b\n--- | ---\n1 | 2 | 3\n4")[0].rows, [["1", "2"], ["4", ""]]);
  assert.deepEqual(types("a | b\n--- | --- | ---"), ["paragraph"]);
  assert.deepEqual(types("a | b\n|--|"), ["paragraph"]);
});

test("a table is not settled before its delimiter row is complete", () => {
  const typing = "Intro\n| a | b |\n|---|--";
  const blocks = parseBlocks(typing);
  assert.deepEqual(blocks.map((b) => b.type), ["paragraph", "table"]);
  assert.equal(settledCount(blocks, typing), 0, "the intro could still take the header row back");
  const more = typing + "-|\n| 1 |";
  assert.equal(settledCount(parseBlocks(more), more), 1);
});
