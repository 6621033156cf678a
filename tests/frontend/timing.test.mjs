import assert from "node:assert/strict";
import { test } from "node:test";

import { DEVELOPER_KEY, developerMode } from "../../frontend/developer.js";
import { AnswerClock } from "../../frontend/timing.js";

test("the clock measures from Send to the first character on screen, and the rate text arrived at", () => {
  const clock = new AnswerClock(1000);
  clock.received("Photo", 1250); // starts the rate's clock
  clock.shown(1300);
  clock.received("synthesis ", 1500);
  clock.shown(1600); // only the first character counts
  clock.received("is ", 1750);
  clock.received("", 1800); // nothing arrived
  assert.equal(clock.summary(), "first character 0.30 s after Send · 4.0 tokens/s, 26 characters/s received");
});

test("an answer of one piece has no rate, and one that ended without text says when it ended", () => {
  const one = new AnswerClock(0);
  one.received("Yes.", 400);
  one.shown(420);
  one.ended(430);
  assert.equal(one.summary(), "first character 0.42 s after Send");
  const none = new AnswerClock(1000);
  assert.equal(none.summary(), "");
  none.ended(1250);
  assert.equal(none.summary(), "no text on screen; ended 0.25 s after Send");
});

test("characters are counted as the student sees them, not as UTF-16 units", () => {
  const clock = new AnswerClock(0);
  clock.received("a", 0);
  clock.received("😀😀", 1000);
  assert.match(clock.summary(), /1\.0 tokens\/s, 2 characters\/s received$/);
});

function storage() {
  const kept = new Map();
  return {
    kept,
    getItem: (k) => kept.get(k) ?? null,
    setItem: (k, v) => kept.set(k, String(v)),
    removeItem: (k) => kept.delete(k),
  };
}

test("developer figures are off by default, ?dev=1 turns them on and keeps them, ?dev=0 turns them off", () => {
  const kept = storage();
  assert.equal(developerMode("", kept), false);
  assert.equal(developerMode("?dev=1", kept), true);
  assert.equal(kept.kept.get(DEVELOPER_KEY), "1");
  assert.equal(developerMode("?q=x", kept), true, "kept in this browser after the flag is gone");
  assert.equal(developerMode("?dev=0", kept), false);
  assert.equal(developerMode("", kept), false);
});

test("with storage switched off the flag still holds for the page", () => {
  const broken = {
    getItem() {
      throw new Error("SecurityError");
    },
    setItem() {
      throw new Error("SecurityError");
    },
    removeItem() {},
  };
  assert.equal(developerMode("?dev=1", broken), true);
  assert.equal(developerMode("", broken), false);
});
