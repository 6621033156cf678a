import assert from "node:assert/strict";
import { test } from "node:test";

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
