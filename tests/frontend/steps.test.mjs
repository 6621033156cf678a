import assert from "node:assert/strict";
import { test } from "node:test";

import { parseServerMessage } from "../../frontend/protocol.js";
import { applyMessage, restoreTurns, stopTurn } from "../../frontend/state.js";
import { StepTyper, stepNode } from "../../frontend/steps.js";
import { Writer } from "../../frontend/writer.js";
import { FakeElement, fakeDocument, html } from "./fake-dom.mjs";

const step = (index, expression, result, error = null) => ({ type: "tool_step", id: "x", index, name: "calculator", expression, result, error });

test("a step is a small line of DOM nodes: the expression as code, the value in bold", () => {
  const line = stepNode(fakeDocument, { at: 0, index: 0, expression: "12 * 7", result: "84", error: null });
  assert.equal(html(line), '<p class="tool-step"><span class="tool-step-name">Calculator</span> <code>12 * 7</code> = <strong>84</strong></p>');
  const refused = stepNode(fakeDocument, { at: 0, index: 1, expression: "1/0", result: "division by zero", error: "division_by_zero" });
  assert.equal(html(refused), '<p class="tool-step refused"><span class="tool-step-name">Calculator</span> <code>1/0</code>: <span>division by zero</span></p>');
});

test("an expression that looks like markup stays text (the fake DOM throws on innerHTML)", () => {
  const line = stepNode(fakeDocument, { at: 0, index: 0, expression: "<img src=x onerror=alert(1)>", result: "<b>1</b>", error: null });
  assert.ok(![...line.descendants()].some((n) => n.tagName === "IMG" || n.tagName === "B"));
  assert.match(line.textContent, /<img src=x onerror=alert\(1\)> = <b>1<\/b>/);
});

test("steps are shown where the text had reached when they came, however the text is typed", () => {
  const steps = [
    { at: 19, index: 0, expression: "12 * 7", result: "84", error: null },
    { at: 32, index: 1, expression: "84 / 2", result: "42", error: null },
  ];
  const answer = "Let me work it out. So it is 84. Half is 42.";
  const whole = (pieces) => {
    const root = new FakeElement("div");
    const writer = new Writer(root, fakeDocument);
    const typer = new StepTyper(writer, fakeDocument);
    for (const piece of pieces) typer.type(piece, steps);
    writer.flush();
    return html(root);
  };
  const expected = "<div><p>Let me work it out.</p>" +
    '<p class="tool-step"><span class="tool-step-name">Calculator</span> <code>12 * 7</code> = <strong>84</strong></p>' +
    "<p>So it is 84.</p>" +
    '<p class="tool-step"><span class="tool-step-name">Calculator</span> <code>84 / 2</code> = <strong>42</strong></p>' +
    "<p>Half is 42.</p></div>";
  assert.equal(whole([answer]), expected);
  assert.equal(whole([...answer]), expected); // a character at a time, as the pacer releases it
  assert.equal(whole(["Let me work it out. So", " it is 84.", "", " Half is 42."]), expected);
});

test("a step that came after all the text so far shows at once, before any more text", () => {
  const root = new FakeElement("div");
  const writer = new Writer(root, fakeDocument);
  const typer = new StepTyper(writer, fakeDocument);
  typer.type("Let me see.", []);
  typer.type("", [{ at: 11, index: 0, expression: "2+2", result: "4", error: null }]);
  assert.equal(typer.shown, 1);
  assert.match(html(root), /<p>Let me see.<\/p><p class="tool-step">.*<\/p><span class="caret"/);
});

test("a tool_step frame is read, kept once at the answer's length, and survives a reload; Stop keeps those shown", () => {
  const frame = parseServerMessage(JSON.stringify(step(0, "12 * 7", "84")));
  assert.equal(frame?.type, "tool_step");
  assert.equal(parseServerMessage(JSON.stringify({ ...step(0, "1", "1"), index: "0" })), null);
  assert.equal(parseServerMessage(JSON.stringify({ ...step(0, "1", "1"), error: 5 })), null);
  const fresh = { id: "x", question: "q", answer: "", status: "waiting", note: "", stats: "", steps: [] };
  const frames = [{ type: "token", id: "x", index: 0, text: "Let me." }, frame, frame, { type: "token", id: "x", index: 9, text: " 84." },
    step(1, "84 / 0", "division by zero", "division_by_zero")];
  const turn = frames.reduce(applyMessage, fresh);
  assert.deepEqual(turn.steps, [
    { at: 7, index: 0, expression: "12 * 7", result: "84", error: null },
    { at: 11, index: 1, expression: "84 / 0", result: "division by zero", error: "division_by_zero" },
  ]);
  const [restored] = restoreTurns(JSON.parse(JSON.stringify([{ ...turn, status: "done" }])));
  assert.deepEqual(restored.steps, turn.steps);
  const [damaged] = restoreTurns([{ ...turn, status: "done", steps: [{ at: 99, index: 0, expression: "x", result: "1" }, "junk"] }]);
  assert.deepEqual(damaged.steps, []);
  assert.deepEqual(stopTurn(turn, "Let me.", 1).steps, turn.steps.slice(0, 1));
  assert.equal(applyMessage({ ...fresh, status: "done" }, frame).steps.length, 0); // an ended answer never changes
});
