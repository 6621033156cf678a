import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { nextRequest, resumableChat } from "../../frontend/reconnect.js";
import { Connection } from "../../frontend/transport.js";
import { FakeSocket } from "./fake-socket.mjs";

const connections = [];
function connect(options = {}) {
  const conn = new Connection("ws://test/ws", { WebSocket: /** @type {any} */ (FakeSocket), random: () => 1, baseDelayMs: 1, maxDelayMs: 1, ...options });
  connections.push(conn);
  conn.connect();
  return conn;
}
afterEach(() => {
  connections.splice(0).forEach((c) => c.close());
  FakeSocket.all = [];
});

const tick = () => new Promise((resolve) => setTimeout(resolve, 5));
const frame = { type: "chat", id: "q", messages: [{ role: "user", content: "why?" }] };
const token = (index, text, ids = [100 + index]) => ({ type: "token", id: "q", index, text, ids });
const end = { type: "end", id: "q", reason: "eos", usage: { prompt_tokens: 1, completion_tokens: 4 }, timings: null };

async function collect(gen) {
  const out = [];
  for await (const msg of gen) out.push(msg);
  return out;
}

/** The page's answer so far, as app.js builds it: each token's text appended. */
const textOf = (msgs) => msgs.filter((m) => m.type === "token").map((m) => m.text).join("");

test("a dropped socket's answer is resumed on the next one from the first token the page lacks", async () => {
  const conn = connect();
  const done = collect(resumableChat(conn, frame, undefined, { online: () => true }));
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [{ ...frame, resumable: true }]);
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 3, resume_token: "secret" });
  FakeSocket.last.receive(token(0, "A prime "));
  FakeSocket.last.receive(token(1, "has two "));
  FakeSocket.last.drop();
  await tick(); // the transport reconnects after its (tiny) backoff
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [{ type: "resume", id: "q", token: "secret", from: 2 }]);
  FakeSocket.last.receive({ type: "resumed", id: "q" });
  FakeSocket.last.receive(token(1, "has two ")); // a frame the page already has is never shown twice
  FakeSocket.last.receive(token(2, "divisors."));
  FakeSocket.last.receive(end);
  const msgs = await done;
  assert.equal(textOf(msgs), "A prime has two divisors.");
  assert.deepEqual(msgs.map((m) => m.type), ["start", "token", "token", "reconnecting", "resumed", "token", "end"]);
});

test("where the new server does not have the chat, it is sent again to be continued after the text and ids held", async () => {
  const conn = connect();
  const done = collect(resumableChat(conn, frame, undefined, { online: () => true }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 3, resume_token: "secret" });
  FakeSocket.last.receive(token(0, "A prime ", [7, 8]));
  FakeSocket.last.receive(token(2, "has", [9]));
  FakeSocket.last.drop();
  await tick();
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "error", id: "q", code: "not_found", message: "not kept here" });
  await tick();
  assert.deepEqual(FakeSocket.last.sent.at(-1), { ...frame, resumable: true, continue: { text: "A prime has", ids: [7, 8, 9] } });
  FakeSocket.last.receive({ type: "queued", id: "q", position: 1, resume_token: "other" }); // the continuation waits
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 6, continued: "ids", resume_token: "other" });
  FakeSocket.last.receive(token(3, " two divisors."));
  FakeSocket.last.receive(end);
  const msgs = await done;
  assert.equal(textOf(msgs), "A prime has two divisors.");
  assert.equal(msgs.filter((m) => m.type === "start").length, 1, "the page's turn has one start");
  assert.ok(!msgs.some((m) => m.type === "queued" || m.type === "error"));
});

test("the next request: a resume while a server may have the chat, else the chat again, continued if it had text", () => {
  assert.deepEqual(nextRequest(frame, "t", 4, "abcd", [1, 2, 3, 4]), { type: "resume", id: "q", token: "t", from: 4 });
  assert.deepEqual(nextRequest(frame, "", 0, "", []), { ...frame, resumable: true });
  assert.deepEqual(nextRequest(frame, "", 2, "ab", [1, 2]), { ...frame, resumable: true, continue: { text: "ab", ids: [1, 2] } });
  // ids missing for some tokens (a server that does not send them): the text alone
  assert.deepEqual(nextRequest(frame, "", 2, "ab", []), { ...frame, resumable: true, continue: { text: "ab" } });
});

test("it gives up with disconnected only after several failed attempts while online", async () => {
  let online = false;
  const conn = connect();
  const done = collect(resumableChat(conn, frame, undefined, { maxAttempts: 3, online: () => online }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 3, resume_token: "secret" });
  FakeSocket.last.drop();
  for (let i = 0; i < 10; i++) {
    await tick();
    FakeSocket.last.drop(); // offline: every attempt fails, and none counts
  }
  online = true;
  for (let i = 0; i < 3; i++) {
    await tick();
    FakeSocket.last.drop();
  }
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.code ?? m.type), ["start", "reconnecting", "disconnected"]);
});

test("stopping while it waits to reconnect ends the answer as cancelled", async () => {
  const conn = connect({ baseDelayMs: 60000, maxDelayMs: 60000 });
  const controller = new AbortController();
  const done = collect(resumableChat(conn, frame, controller.signal, { online: () => true }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive(token(0, "par"));
  FakeSocket.last.drop();
  await tick();
  FakeSocket.last.drop(); // the immediate retry fails; the next waits a minute
  controller.abort();
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.reason ?? m.type), ["token", "reconnecting", "cancelled"]);
});

test("a chat dropped before anything came is simply sent again", async () => {
  const conn = connect();
  const done = collect(resumableChat(conn, frame, undefined, { online: () => true }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.drop();
  await tick();
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [{ ...frame, resumable: true }]);
  FakeSocket.last.receive(end);
  assert.equal((await done).at(-1).type, "end");
});

test("a socket that goes quiet during a chat is pinged, then abandoned as dead and the chat resumed", async () => {
  const conn = connect({ quietMs: 40, pongWaitMs: 40 });
  const done = collect(resumableChat(conn, frame, undefined, { online: () => true }));
  const first = FakeSocket.last;
  first.open();
  await tick();
  first.receive({ type: "start", id: "q", prompt_tokens: 3, resume_token: "secret" });
  first.receive(token(0, "Hi"));
  while (FakeSocket.last === first) await tick(); // it pings, hears nothing, gives the socket up and reconnects
  assert.deepEqual(first.sent.at(-1), { type: "ping" });
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [{ type: "resume", id: "q", token: "secret", from: 1 }]);
  FakeSocket.last.receive({ type: "resumed", id: "q" });
  FakeSocket.last.receive(end);
  assert.equal((await done).at(-1).type, "end");
});

test("the socket's URL is asked again at each connect, so it can name the open chat", async () => {
  let chat = "one";
  const conn = new Connection(() => `ws://test/ws?conversation=${chat}`, { WebSocket: /** @type {any} */ (FakeSocket), baseDelayMs: 1, random: () => 1 });
  connections.push(conn);
  conn.connect();
  chat = "two";
  FakeSocket.last.drop();
  await tick();
  assert.deepEqual(FakeSocket.all.map((s) => s.url), ["ws://test/ws?conversation=one", "ws://test/ws?conversation=two"]);
});

test("after a reload it resumes from what the page held: no start again, the text goes on once", async () => {
  const conn = connect();
  const from = { token: "secret", next: 2, text: "A prime ", ids: [100, 101] };
  const progress = [];
  const done = collect(resumableChat(conn, frame, undefined, { online: () => true, from, onProgress: (p) => progress.push(JSON.parse(JSON.stringify(p))) }));
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [{ type: "resume", id: "q", token: "secret", from: 2 }]);
  FakeSocket.last.receive({ type: "resumed", id: "q" });
  FakeSocket.last.receive(token(2, "has two divisors."));
  FakeSocket.last.receive(end);
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.type), ["resumed", "token", "end"]);
  assert.deepEqual(progress, [{ token: "secret", next: 3, text: "A prime has two divisors.", ids: [100, 101, 102] }]);
});

test("after a reload where no server kept it, the chat is sent again continued after the text held", async () => {
  const conn = connect();
  const from = { token: "secret", next: 2, text: "A prime ", ids: [100, 101] };
  const progress = [];
  const done = collect(resumableChat(conn, frame, undefined, { online: () => true, from, onProgress: (p) => progress.push({ ...p }) }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "error", id: "q", code: "not_found", message: "not kept here" });
  await tick();
  assert.deepEqual(FakeSocket.last.sent.at(-1), { ...frame, resumable: true, continue: { text: "A prime ", ids: [100, 101] } });
  assert.equal(progress[0].token, "", "a reload now would continue, not resume");
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 6, continued: "ids", resume_token: "other" });
  await tick();
  assert.equal(progress.at(-1).token, "other");
  FakeSocket.last.receive(token(2, "has two divisors."));
  FakeSocket.last.receive(end);
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.type), ["token", "end"]);
});

test("the progress is told at each token and resume token, for a reload to resume from", async () => {
  const conn = connect();
  const progress = [];
  const done = collect(resumableChat(conn, frame, undefined, { online: () => true, onProgress: (p) => progress.push(JSON.parse(JSON.stringify(p))) }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "queued", id: "q", position: 1, resume_token: "secret" });
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 3, resume_token: "secret" });
  FakeSocket.last.receive(token(0, "A ", [5]));
  FakeSocket.last.receive(token(2, "prime", [6, 7]));
  FakeSocket.last.receive(end);
  await done;
  assert.deepEqual(progress, [
    { token: "secret", next: 0, text: "", ids: [] },
    { token: "secret", next: 1, text: "A ", ids: [5] },
    { token: "secret", next: 3, text: "A prime", ids: [5, 6, 7] },
  ]);
});

test("Stop during a drop ends the answer at once, and the stop goes out on the next socket before a later question", async () => {
  const conn = connect({ baseDelayMs: 60000, maxDelayMs: 60000 });
  const controller = new AbortController();
  const done = collect(resumableChat(conn, frame, controller.signal, { online: () => true }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 3, resume_token: "secret" });
  FakeSocket.last.receive(token(0, "par"));
  FakeSocket.last.drop();
  await tick();
  FakeSocket.last.drop(); // the immediate retry fails; the next waits a minute
  controller.abort();
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.reason ?? m.type), ["start", "token", "reconnecting", "cancelled"]);
  const later = collect(conn.chat({ type: "chat", id: "q2", messages: [{ role: "user", content: "next" }] }));
  await tick();
  assert.equal(FakeSocket.last.readyState, 0, "a socket is opening now, not in a minute");
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [{ type: "resume", id: "q", token: "secret", from: 1 }, { type: "stop", id: "q" }]);
  FakeSocket.last.receive({ type: "resumed", id: "q" });
  FakeSocket.last.receive({ ...end, reason: "cancelled" });
  await tick();
  assert.deepEqual(FakeSocket.last.sent.at(-1).id, "q2", "the later question goes out once the stopped chat ended");
  FakeSocket.last.receive({ ...end, id: "q2" });
  assert.equal((await later).at(-1).type, "end");
});

test("Stop during a drop after the answer ended meanwhile: the resume finds it over, and nothing more happens", async () => {
  const conn = connect({ baseDelayMs: 60000, maxDelayMs: 60000 });
  const controller = new AbortController();
  const done = collect(resumableChat(conn, frame, controller.signal, { online: () => true }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 3, resume_token: "secret" });
  FakeSocket.last.drop();
  await tick();
  FakeSocket.last.drop();
  controller.abort();
  await done;
  conn.connect(); // the network is back
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "error", id: "q", code: "not_found", message: "not kept here" });
  FakeSocket.last.receive({ type: "error", id: "q", code: "not_found", message: "the stop's" });
  await tick();
  assert.deepEqual(FakeSocket.last.sent.map((f) => f.type), ["resume", "stop"]);
});

test("Stop pressed as the socket died (its stop lost): the chat is taken over and stopped when a socket is back", async () => {
  const conn = connect({ baseDelayMs: 60000, maxDelayMs: 60000 });
  const controller = new AbortController();
  const done = collect(resumableChat(conn, frame, controller.signal, { online: () => true }));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "start", id: "q", prompt_tokens: 3, resume_token: "secret" });
  FakeSocket.last.receive(token(0, "par"));
  controller.abort(); // the stop goes into a socket that is already dead
  assert.deepEqual(FakeSocket.last.sent.at(-1), { type: "stop", id: "q" });
  FakeSocket.last.drop();
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.reason ?? m.type), ["start", "token", "cancelled"]);
  await tick();
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [{ type: "resume", id: "q", token: "secret", from: 1 }, { type: "stop", id: "q" }]);
});
