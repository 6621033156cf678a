import assert from "node:assert/strict";
import { test } from "node:test";

import { fitToLimits, load, messagesFor, moveTo, save } from "../../frontend/state.js";

const turn = (question, answer, status = "done") => ({ id: "x", question, answer, status, note: "", stats: "" });

class MemoryStorage {
  items = new Map();
  getItem(k) {
    return this.items.get(k) ?? null;
  }
  setItem(k, v) {
    this.items.set(k, v);
  }
}

test("a turn moves forward only", () => {
  const t = turn("q", "", "waiting");
  moveTo(t, "queued");
  moveTo(t, "queued");
  moveTo(t, "streaming");
  moveTo(t, "stopped");
  assert.throws(() => moveTo(t, "streaming"), /cannot go from stopped to streaming/);
});

test("the whole conversation is sent, without answers that failed empty", () => {
  const turns = [turn("2+2?", "4"), turn("why?", "", "failed"), turn("and 3+3?", "6", "stopped"), turn("thanks", "", "waiting")];
  assert.deepEqual(messagesFor(turns), [
    { role: "user", content: "2+2?" },
    { role: "assistant", content: "4" },
    { role: "user", content: "and 3+3?" },
    { role: "assistant", content: "6" },
    { role: "user", content: "thanks" },
  ]);
});

test("the conversation survives a reload; an unfinished answer comes back as interrupted", () => {
  const storage = new MemoryStorage();
  save(storage, { turns: [turn("a", "b"), turn("c", "partial", "streaming")], connection: "open", retryInMs: 0 });
  const { turns } = load(storage);
  assert.deepEqual(turns.map((t) => [t.question, t.answer, t.status]), [["a", "b", "done"], ["c", "partial", "interrupted"]]);
  assert.match(turns[1].note, /reloaded/);
});

test("damaged storage gives an empty conversation, not a broken page", () => {
  const storage = new MemoryStorage();
  storage.setItem("typewriter.conversation.v1", "{not json");
  assert.deepEqual(load(storage).turns, []);
  storage.setItem("typewriter.conversation.v1", JSON.stringify({ turns: [{ question: 1 }, null, turn("ok", "yes")] }));
  assert.deepEqual(load(storage).turns.map((t) => t.question), ["ok"]);
});

test("a conversation over the server's limits loses its oldest exchanges, never the question", () => {
  const turns = [turn("q1", "a1"), turn("q2", "a2"), turn("q3", "a3"), turn("q4", "")];
  const size = (m) => JSON.stringify(m).length;
  const byCount = fitToLimits(messagesFor(turns), { maxMessages: 3, size });
  assert.deepEqual(byCount.map((m) => m.content), ["q3", "a3", "q4"]);
  const bySize = fitToLimits(messagesFor(turns), { maxBytes: size(messagesFor(turns).slice(-3)), size });
  assert.deepEqual(bySize.map((m) => m.content), ["q3", "a3", "q4"]);
  assert.equal(fitToLimits(messagesFor([turn("x".repeat(100), "")]), { maxBytes: 50, size }), null);
});
