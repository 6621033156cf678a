import assert from "node:assert/strict";
import { test } from "node:test";

import { RESUME_KEY, answerToResume, clearAnswer, loadAnswer, saveAnswer } from "../../frontend/resume.js";

class MemoryStorage {
  items = new Map();
  full = false;
  getItem(k) {
    return this.items.get(k) ?? null;
  }
  setItem(k, v) {
    if (this.full) throw new DOMException("full", "QuotaExceededError");
    this.items.set(k, v);
  }
  removeItem(k) {
    this.items.delete(k);
  }
}

const frame = { type: "chat", id: "t1", messages: [{ role: "user", content: "why?" }] };
const saved = { chat: "c1", frame, token: "secret", next: 3, text: "Because ", ids: [7, 8, 9] };
const turn = (status, id = "t1") => ({ id, question: "why?", answer: "Because it", status, note: "", stats: "" });

test("the answer's progress comes back as it was saved", () => {
  const storage = new MemoryStorage();
  assert.equal(saveAnswer(storage, saved), true);
  assert.deepEqual(loadAnswer(storage), saved);
});

test("a storage that refuses only means a reload cannot resume", () => {
  const storage = new MemoryStorage();
  storage.full = true;
  assert.equal(saveAnswer(storage, saved), false);
  assert.equal(loadAnswer(storage), null);
});

test("a damaged or partial record is no answer to resume", () => {
  const storage = new MemoryStorage();
  for (const bad of ["{not json", "null", JSON.stringify({ ...saved, next: -1 }), JSON.stringify({ ...saved, ids: ["x"] }),
    JSON.stringify({ ...saved, frame: { type: "resume", id: "t1" } }), JSON.stringify({ ...saved, token: 5 })]) {
    storage.items.set(RESUME_KEY, bad);
    assert.equal(loadAnswer(storage), null, bad);
  }
});

test("clearing with a turn id leaves a newer answer's record alone", () => {
  const storage = new MemoryStorage();
  saveAnswer(storage, saved);
  clearAnswer(storage, "an older turn");
  assert.deepEqual(loadAnswer(storage), saved);
  clearAnswer(storage, "t1");
  assert.equal(storage.getItem(RESUME_KEY), null);
  saveAnswer(storage, saved);
  clearAnswer(storage);
  assert.equal(storage.getItem(RESUME_KEY), null);
});

test("only the open chat's unfinished last answer is resumed", () => {
  assert.equal(answerToResume(saved, "c1", turn("interrupted")), saved);
  assert.equal(answerToResume(saved, "c2", turn("interrupted")), null, "another chat is open");
  assert.equal(answerToResume(saved, "c1", turn("interrupted", "t2")), null, "a later question");
  assert.equal(answerToResume(saved, "c1", turn("stopped")), null, "stopped before the reload");
  assert.equal(answerToResume(saved, "c1", turn("done")), null);
  assert.equal(answerToResume(saved, "c1", undefined), null);
  assert.equal(answerToResume(null, "c1", turn("interrupted")), null);
});
