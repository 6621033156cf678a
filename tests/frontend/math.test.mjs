import assert from "node:assert/strict";
import { test } from "node:test";

import { parseInline } from "../../frontend/inline.js";
import { mathAt } from "../../frontend/math.js";
import { Writer } from "../../frontend/writer.js";
import { FakeElement, fakeDocument, html } from "./fake-dom.mjs";

/** The formulas parseInline finds in `s`, as [tex, display] pairs, and the text around them. */
const formulas = (s) => parseInline(s).filter((n) => n.type === "math").map((n) => [n.tex, n.display]);
const text = (s) => parseInline(s).filter((n) => n.type === "text").map((n) => n.value).join("|");

test("the four delimiters: $…$ and \\(…\\) inline, $$…$$ and \\[…\\] displayed", () => {
  assert.deepEqual(formulas("Area $\\pi r^2$, energy \\(E = mc^2\\)."), [["\\pi r^2", false], ["E = mc^2", false]]);
  assert.deepEqual(formulas("$$\\int_0^1 x\\,dx$$ and \\[ a^2 + b^2 = c^2 \\]"), [["\\int_0^1 x\\,dx", true], ["a^2 + b^2 = c^2", true]]);
  assert.deepEqual(formulas("$$\nx = \\frac{-b \\pm \\sqrt{b^2-4ac}}{2a}\n$$"), [["x = \\frac{-b \\pm \\sqrt{b^2-4ac}}{2a}", true]]);
});

test("TeX inside a formula is not Markdown: stars, underscores, backslashes and pipes stay", () => {
  assert.deepEqual(formulas("$a*b*c$ and $x_1 + y_2$ and \\[ \\begin{matrix} 1 \\\\ 2 \\end{matrix} \\]"), [
    ["a*b*c", false], ["x_1 + y_2", false], ["\\begin{matrix} 1 \\\\ 2 \\end{matrix}", true]]);
  assert.deepEqual(parseInline("*italic $a*b$ still*")[0].type, "em");
  assert.deepEqual(formulas("\\(\\left( x \\right)\\)"), [["\\left( x \\right)", false]]);
});

test("prices are not formulas; an escaped dollar is a dollar; code spans win", () => {
  assert.deepEqual(formulas("It costs $5 and $10 later."), []);
  assert.deepEqual(formulas("From $5-$10"), []);
  assert.deepEqual(formulas("\\$x\\$ is not math"), []);
  assert.equal(text("\\$x\\$ is not math"), "$x$ is not math");
  assert.deepEqual(formulas("`$x$` in code"), []);
  assert.deepEqual(formulas("$ x$ and $x $"), []);
  assert.deepEqual(formulas("$\\$5$"), [["\\$5", false]]);
});

test("mathAt gives the source with its delimiters, for showing when TeX cannot parse it", () => {
  assert.deepEqual(mathAt("say \\[\\frac{1}{\\]!", 4), { tex: "\\frac{1}{", display: true, source: "\\[\\frac{1}{\\]", end: 17 });
  assert.equal(mathAt("$$ $$", 0), null, "an empty formula is text");
});

test("while streaming, an unfinished formula is plain text, as typed, until it closes", () => {
  const answer = "So $x^2$ and $$\\sum_{k=1}^n k$$ and \\(a\\) and \\[b\\] end.";
  const closedAt = [];
  let before = 0;
  for (let i = 1; i <= answer.length; i++) {
    const prefix = answer.slice(0, i);
    const nodes = parseInline(prefix);
    const found = nodes.filter((n) => n.type === "math");
    // The page shows exactly what was typed: formulas' sources plus text, nothing lost or changed.
    const shown = nodes.map((n) => (n.type === "math" ? n.source : n.value)).join("");
    assert.equal(shown, prefix, `after ${JSON.stringify(prefix)}`);
    assert.ok(found.length >= before, `a formula went back to text after ${JSON.stringify(prefix)}`);
    if (found.length > before) closedAt.push(prefix.slice(-2));
    before = found.length;
  }
  assert.deepEqual(closedAt, ["2$", "$$", "\\)", "\\]"], "each formula appears when its closing delimiter arrives");
});

test("an unclosed $$ is not read as a dollar then a one-letter formula", () => {
  assert.deepEqual(formulas("$$x$ "), []);
  assert.equal(text("$$x$ "), "$$x$ ");
  assert.equal(text("\\(x + 1"), "\\(x + 1", "the backslash stays while the formula is open");
});

test("without KaTeX, a formula renders as its source; the caret goes after a formula, not into it", () => {
  const root = new FakeElement("div");
  const writer = new Writer(root, fakeDocument);
  writer.feed("Area $\\pi r^2$");
  assert.equal(html(root), '<div><p>Area <span class="math-source">$\\pi r^2$</span><span class="caret" aria-hidden="true"></span></p></div>');
  const drawn = new FakeElement("div");
  const katexLike = {
    math: (m, doc) => {
      const box = doc.createElement("span");
      box.className = "math";
      box.append(doc.createElement("span"));
      return box;
    },
  };
  const w2 = new Writer(drawn, fakeDocument, undefined, katexLike);
  w2.feed("Area $x$");
  assert.equal(html(drawn), '<div><p>Area <span class="math"><span></span></span><span class="caret" aria-hidden="true"></span></p></div>');
});
