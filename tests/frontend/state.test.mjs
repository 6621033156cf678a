import assert from "node:assert/strict";
import { test } from "node:test";

import { applyMessage, fitToLimits, messagesFor, moveTo, restoreTurns, resumeTurn, stopTurn } from "../../frontend/state.js";

const turn = (question, answer, status = "done") => ({ id: "x", question, answer, status, note: "", stats: "" });

test("a turn moves forward only, and moving gives a new turn", () => {
  const waiting = turn("q", "", "waiting");
  const stopped = moveTo(moveTo(moveTo(moveTo(waiting, "queued"), "queued"), "streaming"), "stopped");
  assert.equal(stopped.status, "stopped");
  assert.equal(waiting.status, "waiting");
  assert.throws(() => moveTo(stopped, "streaming"), /cannot go from stopped to streaming/);
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

test("turns survive a reload; an unfinished answer comes back as interrupted", () => {
  const turns = restoreTurns(JSON.parse(JSON.stringify([turn("a", "b"), turn("c", "partial", "streaming")])));
  assert.deepEqual(turns.map((t) => [t.question, t.answer, t.status]), [["a", "b", "done"], ["c", "partial", "interrupted"]]);
  assert.match(turns[1].note, /reloaded/);
});

test("an answer resumed after a reload streams on from the text the page had, and only an interrupted one", () => {
  const [restored] = restoreTurns([turn("c", "partial answer", "streaming")]);
  const resumed = resumeTurn(restored, "partial");
  assert.deepEqual([resumed.status, resumed.answer, resumed.note], ["streaming", "partial", ""]);
  assert.equal(applyMessage(resumed, { type: "token", id: "x", index: 4, text: " answer" }).answer, "partial answer");
  assert.throws(() => resumeTurn(turn("a", "b", "stopped"), "b"), /cannot go from stopped to streaming/);
});

test("damaged turns are left out, not a broken page", () => {
  assert.deepEqual(restoreTurns("{not json"), []);
  assert.deepEqual(restoreTurns([{ question: 1 }, null, turn("ok", "yes"), turn("bad", "x", "flying")]).map((t) => t.question), ["ok"]);
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

// ---- applyMessage: protocol v1 frames into turn state ----

const id = "x";
const timings = { queue_ms: 0, ttft_ms: 250, total_ms: 900, tokens_per_s: 20 };
const usage = { prompt_tokens: 12, completion_tokens: 3 };
const queued = (position) => ({ type: "queued", id, position });
const start = { type: "start", id, prompt_tokens: 12 };
const token = (text, index = 0) => ({ type: "token", id, index, text });
const end = (reason) => ({ type: "end", id, reason, usage, timings });
const error = (code) => ({ type: "error", id, code, message: "" });

/** Apply frames in order from a fresh waiting turn. */
const run = (frames, from = turn("q", "", "waiting")) => frames.reduce(applyMessage, from);

test("queued frames say the place in line, and start clears it", () => {
  const inLine = run([queued(3)]);
  assert.equal(inLine.status, "queued");
  assert.equal(inLine.note, "2 people ahead of you");
  const next = applyMessage(inLine, queued(1));
  assert.equal(next.note, "You're next — the tutor will start in a moment.");
  const started = applyMessage(next, start);
  assert.deepEqual([started.status, started.note, started.answer], ["streaming", "", ""]);
});

test("a start that left old messages out says so quietly, and a natural end keeps the note", () => {
  const started = run([{ ...start, cached_tokens: 0, dropped_messages: 4 }]);
  assert.equal(started.note, "The tutor no longer sees the first 4 messages of this chat.");
  const done = applyMessage(applyMessage(started, token("ok")), end("eos"));
  assert.equal(done.note, "The tutor no longer sees the first 4 messages of this chat.");
  assert.equal(applyMessage(started, end("length")).note, "The answer reached its length limit.");
  assert.equal(run([{ ...start, dropped_messages: 0 }]).note, "");
});

test("tokens are appended to the answer", () => {
  const t = run([start, token("Photo", 0), token("synthesis", 1)]);
  assert.deepEqual([t.status, t.answer], ["streaming", "Photosynthesis"]);
});

test("a token without a start still starts the answer", () => {
  const t = run([queued(1), token("Hi")]);
  assert.deepEqual([t.status, t.answer, t.note], ["streaming", "Hi", ""]);
});

test("an end finishes the answer; its reason becomes the note, and the server's timings are not the page's", () => {
  const done = run([start, token("4"), end("eos")]);
  assert.deepEqual([done.status, done.answer, done.note], ["done", "4", ""]);
  assert.equal(done.stats, "", "stats are measured on the page (timing.js), not taken from the server");
  const long = run([start, token("4"), end("length")]);
  assert.deepEqual([long.status, long.note], ["done", "The answer reached its length limit."]);
});

test("an end with reason cancelled means stopped", () => {
  const t = run([start, token("4"), end("cancelled")]);
  assert.deepEqual([t.status, t.answer, t.note], ["stopped", "4", "Stopped"]);
});

test("a dropped connection interrupts the answer and keeps its text; other errors fail it", () => {
  const cut = run([start, token("half an "), error("disconnected")]);
  assert.deepEqual([cut.status, cut.answer], ["interrupted", "half an "]);
  assert.match(cut.note, /connection dropped/);
  const busy = run([error("overloaded")]);
  assert.deepEqual([busy.status, busy.answer], ["failed", ""]);
  assert.match(busy.note, /a lot of students/);
  assert.equal(run([error("no_such_code")]).note, run([error("internal")]).note);
});

test("applyMessage never changes the turn it is given", () => {
  const before = turn("q", "a", "streaming");
  const copy = { ...before };
  for (const frame of [queued(1), start, token("b"), end("eos"), error("internal"), { type: "pong" }]) {
    try {
      applyMessage(before, frame);
    } catch {
      // queued after the answer started is not a legal move; that is tested below
    }
    assert.deepEqual(before, copy);
  }
});

test("after Stop the text stays what was shown; late tokens, errors and the end change nothing", () => {
  const streaming = run([start, token("The Babylonians "), token("wrote numbers ")]);
  const stopped = stopTurn(streaming, "The Babylonians wr");
  assert.deepEqual([stopped.status, stopped.answer, stopped.note], ["stopped", "The Babylonians wr", "Stopped"]);
  const late = run([token("in base 60"), error("disconnected"), start, queued(2)], stopped);
  assert.equal(late, stopped, "a late frame changed a stopped turn");
  assert.equal(applyMessage(late, end("cancelled")), stopped);
});

test("Stop before any text keeps an empty answer", () => {
  const stopped = stopTurn(run([queued(2)]), "");
  assert.deepEqual([stopped.status, stopped.answer, stopped.note], ["stopped", "", "Stopped"]);
  assert.throws(() => stopTurn(stopped, ""), /cannot go from stopped to stopped/);
});

test("a frame out of protocol order is a loud error, not a silent state", () => {
  assert.throws(() => run([start, queued(1)]), /cannot go from streaming to queued/);
});
