// A tiny DOM, just enough for render.js and writer.js; `innerHTML` throws so any use of it fails a test.

class FakeNode {
  parentNode = null;
  remove() {
    this.parentNode?.removeChild(this);
  }
}

export class FakeText extends FakeNode {
  nodeType = 3;
  constructor(data) {
    super();
    this.data = String(data);
  }
  get textContent() {
    return this.data;
  }
}

export class FakeElement extends FakeNode {
  nodeType = 1;
  childNodes = [];
  attributes = new Map();
  className = "";
  constructor(tag) {
    super();
    this.tagName = tag.toUpperCase();
  }
  get lastChild() {
    return this.childNodes.at(-1) ?? null;
  }
  append(...nodes) {
    for (const node of nodes) {
      const child = typeof node === "string" ? new FakeText(node) : node;
      child.remove();
      child.parentNode = this;
      this.childNodes.push(child);
    }
  }
  removeChild(child) {
    this.childNodes.splice(this.childNodes.indexOf(child), 1);
    child.parentNode = null;
    return child;
  }
  setAttribute(name, value) {
    this.attributes.set(name, String(value));
  }
  getAttribute(name) {
    return this.attributes.get(name) ?? null;
  }
  get textContent() {
    return this.childNodes.map((n) => n.textContent).join("");
  }
  set textContent(value) {
    this.childNodes = [];
    this.append(new FakeText(value));
  }
  set innerHTML(_) {
    throw new Error("innerHTML used");
  }
  get innerHTML() {
    throw new Error("innerHTML used");
  }
  /** Every element below this one, depth first. */
  *descendants() {
    for (const child of this.childNodes) {
      if (child.nodeType === 1) {
        yield child;
        yield* child.descendants();
      }
    }
  }
}

export const fakeDocument = {
  createElement: (tag) => new FakeElement(tag),
  createTextNode: (data) => new FakeText(data),
};

const escape = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

/** Serialise like a browser would, so tests can read the structure at a glance. */
export function html(node) {
  if (node.nodeType === 3) return escape(node.data);
  const tag = node.tagName.toLowerCase();
  const attrs = [...(node.className ? [["class", node.className]] : []), ...node.attributes]
    .map(([k, v]) => ` ${k}="${escape(v)}"`)
    .join("");
  return `<${tag}${attrs}>${node.childNodes.map(html).join("")}</${tag}>`;
}
