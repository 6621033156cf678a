import assert from "node:assert/strict";
import { test } from "node:test";

import { loadingText } from "../../frontend/status.js";
import { Connection, loadEstimate } from "../../frontend/transport.js";
import { FakeSocket } from "./fake-socket.mjs";

test("a load with a count and a rate says how much is done and about how long is left", () => {
  assert.equal(loadingText({ fraction: 0.4, leftS: 4.2 }), "Getting the tutor ready: 40%… about 5 s left");
  assert.equal(loadingText({ fraction: 0.375, leftS: 59.5 }), "Getting the tutor ready: 37%… about 60 s left");
  assert.equal(loadingText({ fraction: 0.1, leftS: 150 }), "Getting the tutor ready: 10%… about 3 min left");
  assert.equal(loadingText({ fraction: 1 }), "Getting the tutor ready: 100%…");
});

test("with no basis for a number the sentence says none", () => {
  assert.equal(loadingText({}), "Getting the tutor ready…");
  assert.equal(loadingText({ fraction: 0.19 }), "Getting the tutor ready: 19%…"); // one count: no rate yet
  assert.equal(loadingText({ leftS: 5 }), "Getting the tutor ready…"); // a time left without a count is not shown
  assert.equal(loadingText({ fraction: 0.9, leftS: 0.4 }), "Getting the tutor ready: 90%…"); // under a second
});

test("the engine's words and file names reach only the developer view", () => {
  const progress = "int8-lite: rotating the weights";
  assert.equal(loadingText({}, progress), "Getting the tutor ready…");
  assert.equal(loadingText({}, progress, true), "Getting the tutor ready… (int8-lite: rotating the weights)");
  assert.equal(loadingText({ fraction: 0.5, leftS: 2 }, "loading /a/b/model.gguf", true),
    "Getting the tutor ready: 50%… about 2 s left (loading model.gguf)");
});

test("readyz's estimate is kept only where its numbers make sense", () => {
  assert.deepEqual(loadEstimate({ fraction: 0.375, left_s: 4.1 }), { fraction: 0.375, leftS: 4.1 });
  assert.deepEqual(loadEstimate({}), {});
  assert.deepEqual(loadEstimate({ fraction: "40%", left_s: null }), {});
  assert.deepEqual(loadEstimate({ fraction: 1.5, left_s: -2 }), {});
  assert.deepEqual(loadEstimate({ fraction: 0, left_s: Infinity }), { fraction: 0 });
});

test("while the model loads, the transport passes readyz's estimate on with its progress", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const answers = [
    { status: "loading", progress: "int8-lite: program 6/32", fraction: 0.188 },
    { status: "loading", progress: "int8-lite: program 12/32", fraction: 0.375, left_s: 4.1 },
  ];
  const statuses = [];
  const conn = new Connection("ws://test/ws", {
    WebSocket: /** @type {any} */ (FakeSocket),
    onStatus: (s) => statuses.push(s),
    readyUrl: "http://test/readyz",
    fetch: async () => ({ json: async () => answers.shift() ?? { status: "loading" } }),
    pollMs: 1000,
  });
  try {
    conn.start();
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(statuses.at(-1), { state: "warming", retryInMs: 1000, progress: "int8-lite: program 6/32", fraction: 0.188 });
    t.mock.timers.tick(1000);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(statuses.at(-1), {
      state: "warming", retryInMs: 1000, progress: "int8-lite: program 12/32", fraction: 0.375, leftS: 4.1,
    });
    assert.equal(FakeSocket.all.length, 0, "no socket while it loads");
  } finally {
    conn.close();
    FakeSocket.all = [];
  }
});
