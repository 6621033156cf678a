import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { errorText, parseServerMessage, queueText } from "../../frontend/protocol.js";
import { Connection } from "../../frontend/transport.js";
import { FakeSocket } from "./fake-socket.mjs";

const connections = [];
function connect(options = {}) {
  const statuses = [];
  const conn = new Connection("ws://test/ws", {
    WebSocket: /** @type {any} */ (FakeSocket),
    onStatus: (s) => statuses.push(s),
    random: () => 1,
    ...options,
  });
  connections.push(conn);
  conn.connect(); // as the page does on load
  return { conn, statuses };
}
afterEach(() => {
  connections.splice(0).forEach((c) => c.close());
  FakeSocket.all = [];
});

const tick = () => new Promise((resolve) => setImmediate(resolve));
const frame = (id, text = "hi") => ({ type: "chat", id, messages: [{ role: "user", content: text }] });
const end = (id, reason = "eos") => ({
  type: "end", id, reason,
  usage: { prompt_tokens: 5, completion_tokens: 2 },
  timings: { queue_ms: 0, ttft_ms: 120, total_ms: 300, tokens_per_s: 24.5 },
});

async function collect(gen) {
  const out = [];
  for await (const msg of gen) out.push(msg);
  return out;
}

test("a chat yields its queued, start and token messages, then exactly one end", async () => {
  const { conn } = connect();
  const done = collect(conn.chat(frame("a")));
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [frame("a")]);
  const s = FakeSocket.last;
  s.receive({ type: "queued", id: "a", position: 2 });
  s.receive({ type: "start", id: "a", prompt_tokens: 5 });
  s.receive({ type: "token", id: "a", index: 0, text: "Hel" });
  s.receive({ type: "token", id: "other", index: 0, text: "not mine" });
  s.receive("not json at all");
  s.receive({ type: "token", id: "a", index: 1, text: "lo" });
  s.receive(end("a"));
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.type), ["queued", "start", "token", "token", "end"]);
  assert.equal(msgs.filter((m) => m.type === "token").map((m) => m.text).join(""), "Hello");
});

test("aborting sends stop and still yields until the server's end", async () => {
  const { conn } = connect();
  const controller = new AbortController();
  const done = collect(conn.chat(frame("a"), controller.signal));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "token", id: "a", index: 0, text: "par" });
  controller.abort();
  assert.deepEqual(FakeSocket.last.sent.at(-1), { type: "stop", id: "a" });
  FakeSocket.last.receive({ type: "token", id: "a", index: 1, text: "tial" }); // one more decode step may land
  FakeSocket.last.receive(end("a", "cancelled"));
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.type), ["token", "token", "end"]);
  assert.equal(msgs.at(-1).reason, "cancelled");
});

test("aborting before the request was sent ends it as cancelled without sending", async () => {
  const { conn } = connect();
  const controller = new AbortController();
  const done = collect(conn.chat(frame("a"), controller.signal));
  controller.abort();
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => [m.type, m.reason]), [["end", "cancelled"]]);
  assert.deepEqual(FakeSocket.last.sent, []);
});

test("a new chat waits for the previous one's end, so the server never answers busy", async () => {
  const { conn } = connect();
  const controller = new AbortController();
  const first = collect(conn.chat(frame("a"), controller.signal));
  FakeSocket.last.open();
  await tick();
  controller.abort();
  const second = collect(conn.chat(frame("b")));
  await tick();
  assert.deepEqual(FakeSocket.last.sent.map((f) => f.type), ["chat", "stop"]);
  FakeSocket.last.receive(end("a", "cancelled"));
  await first;
  await tick();
  assert.deepEqual(FakeSocket.last.sent.map((f) => f.id), ["a", "a", "b"]);
  FakeSocket.last.receive(end("b"));
  assert.equal((await second).at(-1).reason, "eos");
});

test("errors are terminal; an error without an id belongs to the chat in flight", async () => {
  const { conn } = connect();
  const done = collect(conn.chat(frame("a")));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "error", id: null, code: "invalid_json", message: "bad frame" });
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => [m.type, m.code]), [["error", "invalid_json"]]);
});

test("a dropped socket ends the running chat as disconnected and reconnects with growing delays", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const { conn, statuses } = connect({ baseDelayMs: 500, maxDelayMs: 4000 });
  const done = collect(conn.chat(frame("a")));
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive({ type: "token", id: "a", index: 0, text: "half an ans" });
  FakeSocket.last.drop();
  const msgs = await done;
  assert.deepEqual(msgs.map((m) => m.code ?? m.type), ["token", "disconnected"]);

  const delays = [];
  for (let i = 0; i < 5; i++) {
    delays.push(statuses.at(-1).retryInMs);
    assert.equal(statuses.at(-1).state, "reconnecting");
    const before = FakeSocket.all.length;
    t.mock.timers.tick(delays.at(-1));
    assert.equal(FakeSocket.all.length, before + 1, "a new socket was opened after the delay");
    FakeSocket.last.drop();
  }
  assert.deepEqual(delays, [500, 1000, 2000, 4000, 4000]);

  t.mock.timers.tick(4000);
  FakeSocket.last.open();
  assert.equal(statuses.at(-1).state, "open");
  FakeSocket.last.drop();
  assert.equal(statuses.at(-1).retryInMs, 500, "the backoff starts over after a good connection");
});

test("a server still loading its model (close 1013) reads as warming up, not as a lost connection", (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const { statuses } = connect({ baseDelayMs: 500 });
  FakeSocket.last.drop(1013, "the model is still loading; retry when /readyz is 200");
  assert.equal(statuses.at(-1).state, "warming");
  t.mock.timers.tick(statuses.at(-1).retryInMs);
  assert.equal(statuses.at(-1).state, "warming", "the retry while loading still says warming");
  FakeSocket.last.open();
  FakeSocket.last.drop();
  assert.equal(statuses.at(-1).state, "reconnecting");
});

test("a server at its connection limit (close 1013 for another reason) reads as full, not as loading", (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const { statuses } = connect({ baseDelayMs: 500 });
  FakeSocket.last.drop(1013, "too many connections from your address (at most 64); close one first");
  assert.equal(statuses.at(-1).state, "full");
  t.mock.timers.tick(statuses.at(-1).retryInMs);
  FakeSocket.last.drop(1013, "the server is full (512 connections); try again later");
  assert.equal(statuses.at(-1).state, "full", "and it keeps retrying with backoff");
  assert.ok(statuses.at(-1).retryInMs > 500);
});

test("sending while the socket waits to retry reconnects at once", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const { conn } = connect({ baseDelayMs: 10000 });
  FakeSocket.last.drop();
  const count = FakeSocket.all.length;
  const done = collect(conn.chat(frame("a")));
  await tick();
  assert.equal(FakeSocket.all.length, count + 1);
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive(end("a"));
  assert.equal((await done).length, 1);
});

test("a chat sent on a socket the server closes with 1013 is held and sent again on the next, never failed", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const { conn, statuses } = connect({ baseDelayMs: 500 });
  const msgs = [];
  const done = (async () => {
    for await (const m of conn.chat(frame("a"))) msgs.push(m);
  })();
  FakeSocket.last.open(); // the server accepts, then closes at once: its model is loading
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [frame("a")]);
  FakeSocket.last.drop(1013, "the model is still loading; retry when /readyz is 200");
  await tick();
  assert.deepEqual(msgs, [], "no error: the server read nothing on that socket");
  assert.equal(statuses.at(-1).state, "warming");
  t.mock.timers.tick(statuses.at(-1).retryInMs);
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [frame("a")], "sent again on the new socket");
  FakeSocket.last.receive(end("a"));
  await done;
  assert.deepEqual(msgs.map((m) => m.type), ["end"]);
});

test("while the model loads, readyUrl gives the progress, no socket is opened, and the held question goes when ready", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const answers = [
    { status: "loading", progress: "int8-lite: program 6/32" },
    { status: "loading", progress: "int8-lite: program 19/32" },
    { status: "ready", model: "SmolLM2-135M-Instruct" },
  ];
  const asked = [];
  const fetch = async (url, init) => {
    asked.push([url, init.cache]);
    return { json: async () => answers.shift() };
  };
  const { conn, statuses } = connect({ readyUrl: "http://test/readyz", fetch, pollMs: 1000 });
  FakeSocket.last.open();
  FakeSocket.last.drop(1013, "the model is still loading; retry when /readyz is 200");
  const done = collect(conn.chat(frame("a")));
  await tick();
  assert.deepEqual(statuses.at(-1), { state: "warming", retryInMs: 1000, progress: "int8-lite: program 6/32" });
  assert.equal(FakeSocket.all.length, 1, "asking does not open a socket the server would close");
  t.mock.timers.tick(1000);
  await tick();
  assert.equal(statuses.at(-1).progress, "int8-lite: program 19/32");
  t.mock.timers.tick(1000);
  await tick();
  assert.equal(FakeSocket.all.length, 2, "ready: the socket opens at once");
  assert.deepEqual(asked, [["http://test/readyz", "no-store"], ["http://test/readyz", "no-store"], ["http://test/readyz", "no-store"]]);
  FakeSocket.last.open();
  await tick();
  assert.deepEqual(FakeSocket.last.sent, [frame("a")]);
  FakeSocket.last.receive(end("a"));
  assert.deepEqual((await done).map((m) => m.type), ["end"]);
});

test("when readyUrl cannot be asked, the connection goes back to reconnecting with backoff", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const fetch = async () => {
    throw new TypeError("Failed to fetch");
  };
  const { statuses } = connect({ readyUrl: "http://test/readyz", fetch });
  FakeSocket.last.drop(1013, "the model is still loading; retry when /readyz is 200");
  await tick();
  assert.equal(FakeSocket.all.length, 2, "no readiness to wait for: try the socket");
  FakeSocket.last.drop();
  assert.equal(statuses.at(-1).state, "reconnecting");
});

test("a question asked while the socket is down waits for it rather than failing", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const { conn, statuses } = connect({ baseDelayMs: 500 });
  FakeSocket.last.drop();
  const msgs = [];
  const done = (async () => {
    for await (const m of conn.chat(frame("a"))) msgs.push(m);
  })();
  await tick();
  FakeSocket.last.drop(); // the reconnect asked for fails too
  await tick();
  assert.deepEqual(msgs, []);
  t.mock.timers.tick(statuses.at(-1).retryInMs);
  FakeSocket.last.open();
  await tick();
  FakeSocket.last.receive(end("a"));
  await done;
  assert.deepEqual(msgs.map((m) => m.type), ["end"]);
});

test("a held question stopped before it was sent ends as cancelled and sends nothing", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const { conn } = connect({ readyUrl: "http://test/readyz", fetch: async () => ({ json: async () => ({ status: "loading", progress: "" }) }) });
  FakeSocket.last.drop(1013, "the model is still loading");
  const controller = new AbortController();
  const done = collect(conn.chat(frame("a"), controller.signal));
  await tick();
  controller.abort();
  assert.deepEqual((await done).map((m) => [m.type, m.reason]), [["end", "cancelled"]]);
  assert.deepEqual(FakeSocket.all.flatMap((s) => s.sent), []);
  assert.equal(conn.routes.size, 0);
});

test("frames the page does not understand are ignored", () => {
  assert.equal(parseServerMessage("{"), null);
  assert.equal(parseServerMessage(JSON.stringify({ type: "token", id: 3, text: "x" })), null);
  assert.equal(parseServerMessage(JSON.stringify({ type: "mystery" })), null);
  assert.equal(parseServerMessage(new ArrayBuffer(2)), null);
});

test("every error code has a plain sentence, and queue positions read naturally", () => {
  for (const code of ["invalid_json", "invalid_request", "prompt_too_long", "busy", "overloaded", "not_found", "internal", "disconnected", "question_too_long"]) {
    assert.match(errorText(code), /^[A-Z].{20,}\.$/, code);
    assert.doesNotMatch(errorText(code), /_|json|token/i, code);
  }
  assert.equal(errorText("something_new"), errorText("internal"));
  assert.equal(queueText(3), "2 people ahead of you");
  assert.equal(queueText(2), "1 person ahead of you");
  assert.match(queueText(1), /next/);
});
