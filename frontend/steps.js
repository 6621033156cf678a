// @ts-check
/**
 * The calculator's steps in an answer: each a small line of its own between the text before and after it, built
 * from DOM nodes and Text only (the expression is the model's text and never reaches innerHTML). `StepTyper` feeds
 * an answer's text to its Writer and puts each step in where the text had reached when the step came.
 */

/** @typedef {import("./state.js").Step} Step */
/** @typedef {import("./render.js").Doc} Doc */
/** @typedef {import("./writer.js").Writer} Writer */

/**
 * `Calculator  12 * 7 = 84`, or `Calculator  1/0: division by zero` for a refused one.
 * @param {Doc} doc
 * @param {Step} step
 * @returns {HTMLElement}
 */
export function stepNode(doc, step) {
  const line = doc.createElement("p");
  line.className = step.error ? "tool-step refused" : "tool-step";
  const name = doc.createElement("span");
  name.className = "tool-step-name";
  name.append(doc.createTextNode("Calculator"));
  const expression = doc.createElement("code");
  expression.append(doc.createTextNode(step.expression));
  const result = doc.createElement(step.error ? "span" : "strong");
  result.append(doc.createTextNode(step.result));
  line.append(name, doc.createTextNode(" "), expression, doc.createTextNode(step.error ? ": " : " = "), result);
  return line;
}

export class StepTyper {
  /**
   * @param {Writer} writer
   * @param {Doc} doc
   */
  constructor(writer, doc) {
    this.writer = writer;
    this.doc = doc;
    /** How much of the answer's text the writer has been given. */
    this.fed = 0;
    /** How many of the answer's steps are on screen. */
    this.shown = 0;
  }

  /**
   * The next piece of the answer's text, with every step that comes before its end (or right at it) put in.
   * @param {string} text
   * @param {Step[]} steps  the answer's steps so far, in order
   */
  type(text, steps) {
    let rest = text;
    while (this.shown < steps.length && steps[this.shown].at <= this.fed + rest.length) {
      const cut = Math.max(0, steps[this.shown].at - this.fed);
      this.writer.feed(rest.slice(0, cut));
      this.fed += cut;
      rest = rest.slice(cut);
      this.writer.insert(stepNode(this.doc, steps[this.shown++]));
    }
    this.writer.feed(rest);
    this.fed += rest.length;
  }
}
