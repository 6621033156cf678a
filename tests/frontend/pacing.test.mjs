import assert from "node:assert/strict";
import { test } from "node:test";

import { Pacer, graphemes, wholeWords } from "../../frontend/pacing.js";

const FRAME = 1000 / 60;

/** Run frames from `from` to `to`, returning [time, text] for each frame that showed something. */
function frames(pacer, from, to) {
  const shown = [];
  for (let t = from; t <= to; t += FRAME) {
    const text = pacer.take(t);
    if (text) shown.push([t, text]);
  }
  return shown;
}

test("graphemes keep emoji sequences, flags, accents and CJK whole", () => {
  assert.deepEqual(graphemes("a👩‍🔬b"), ["a", "👩‍🔬", "b"]);
  assert.deepEqual(graphemes("🇯🇵e\u0301"), ["🇯🇵", "e\u0301"]);
  assert.deepEqual(graphemes("汉字👍🏽"), ["汉", "字", "👍🏽"]);
});

test("a grapheme split across two tokens is shown whole, never in halves", () => {
  const pacer = new Pacer();
  pacer.push("hi 👩", 0);
  pacer.push("\u200d🔬 ok", 10); // the zero-width joiner arrives in the next token
  pacer.end(20);
  const pieces = frames(pacer, 20, 600).flatMap(([, text]) => graphemes(text));
  assert.deepEqual(pieces, ["h", "i", " ", "👩‍🔬", " ", "o", "k"]);
});

test("a burst is spread over several frames instead of appearing at once", () => {
  const pacer = new Pacer();
  pacer.take(0);
  pacer.push("The quick brown fox jumps.", 0);
  const shown = frames(pacer, FRAME, 290);
  assert.ok(shown.length >= 5, `only ${shown.length} frames`);
  // The "." is held back in case the next token extends it, but only until its 300 ms deadline.
  assert.equal(shown.map(([, t]) => t).join(""), "The quick brown fox jumps");
  assert.equal(frames(pacer, 290 + FRAME, 400).map(([, t]) => t).join(""), ".");
});

test("the display never lags more than 300 ms behind arrivals, even when text floods in", () => {
  const pacer = new Pacer({ maxLagMs: 300 });
  const arrived = []; // [time, count of graphemes arrived so far]
  let total = 0;
  let shown = 0;
  for (let t = 0; t < 3000; t += FRAME) {
    if (Math.floor(t / 50) !== Math.floor((t - FRAME) / 50)) {
      pacer.push("x".repeat(40), t); // 800 graphemes per second, far faster than anyone reads
      total += 40;
      arrived.push([t, total]);
    }
    shown += pacer.take(t).length;
    // Everything that arrived 300 ms ago (minus the one held-back grapheme) must be on screen.
    const due = arrived.filter(([at]) => at <= t - 300 - FRAME).at(-1)?.[1] ?? 0;
    assert.ok(shown >= due - 1, `at ${t.toFixed(0)} ms shown ${shown} < due ${due - 1}`);
  }
});

test("after the stream ends what is left appears within the catch-up time", () => {
  const pacer = new Pacer({ catchUpMs: 150 });
  pacer.take(0);
  pacer.push("y".repeat(500), 0);
  const early = pacer.take(FRAME);
  pacer.end(FRAME);
  const shown = frames(pacer, 2 * FRAME, 400);
  assert.ok(pacer.done);
  assert.ok(shown.at(-1)[0] <= FRAME + 150 + FRAME, `last text at ${shown.at(-1)[0]}`);
  assert.ok(shown.length >= 5, "the catch-up is still typed, over several frames");
  assert.equal(early.length + shown.map(([, t]) => t).join("").length, 500);
});

test("a slow trickle is shown promptly, one token at a time", () => {
  const pacer = new Pacer();
  pacer.take(0);
  pacer.push("Hi", 0);
  const first = frames(pacer, FRAME, 99).map(([, t]) => t).join("");
  assert.equal(first, "H"); // "i" is held back until the next token shows it cannot grow
  pacer.push(" there", 100);
  assert.equal(frames(pacer, 100, 100 + 300).map(([, t]) => t).join(""), "i ther");
});

test("discard stops the display where it is", () => {
  const pacer = new Pacer();
  pacer.take(0);
  pacer.push("a long answer that is still arriving", 0);
  const before = frames(pacer, FRAME, 3 * FRAME).map(([, t]) => t).join("");
  pacer.discard();
  assert.equal(pacer.take(4 * FRAME), "");
  assert.ok(pacer.done);
  assert.ok(before.length > 0 && before.length < 20, before);
});

test("no credit is saved up while idle, so the next token does not arrive as a burst", () => {
  const pacer = new Pacer();
  for (let i = 0; i <= 120; i++) pacer.take(i * FRAME);
  pacer.push("abcdefghijklmnopqrstuvwxyz!", 120 * FRAME);
  assert.ok(pacer.take(121 * FRAME).length <= 4);
});

test("with reduced motion, text is released whole words at a time", () => {
  assert.equal(wholeWords("hello"), "", "a word still arriving waits");
  assert.equal(wholeWords("hello wor"), "hello ");
  assert.equal(wholeWords("a b  c"), "a b  ");
  assert.equal(wholeWords("line one\nline"), "line one\n");
  assert.equal(wholeWords("done. "), "done. ");
  // Fed in pieces, the words shown add up to the text, and only ever end after white space.
  const text = "The mitochondria is the powerhouse of the cell, they say.";
  let held = "";
  let shown = "";
  for (const piece of text.match(/.{1,3}/gs)) {
    held += piece;
    const out = wholeWords(held);
    held = held.slice(out.length);
    assert.ok(out === "" || /\s$/.test(out), JSON.stringify(out));
    shown += out;
  }
  assert.equal(shown + held, text);
});
