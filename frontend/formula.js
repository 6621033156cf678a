// @ts-check
/**
 * Formulas as KaTeX draws them, for render.js (`Extras.math`).
 *
 * KaTeX (static/vendor/katex, loaded by a deferred script before the page's modules) builds its boxes with
 * createElement and sets their sizes through the CSSOM (`element.style.x = …`), which the page's CSP allows;
 * nothing goes through innerHTML. A formula KaTeX cannot parse is shown as its source, as typed, never as an
 * error box; so is every formula if KaTeX failed to load.
 *
 * While an answer streams its open paragraph is rebuilt on every frame, so each formula would be laid out
 * again and again: the last few hundred are kept and cloned instead.
 */

/** @typedef {import("./render.js").Doc} Doc */
/** @typedef {{tex: string, display: boolean, source: string}} Formula */

const OPTIONS = {
  throwOnError: true,
  output: "htmlAndMathml", // the MathML half is what screen readers read
  strict: "ignore",
  trust: false, // no \href, \includegraphics, \htmlClass…: an answer cannot make links or load images
  maxSize: 20, // em: a \rule or \hspace cannot cover the page
  maxExpand: 500, // a macro bomb stops early
};
/**
 * KaTeX's MathML for these two sets a style attribute, which the CSP refuses (and reports): draw them
 * without it. A fresh copy each time, since KaTeX keeps a formula's \gdef in the object it is given.
 */
const MACROS = { "\\pmb": "\\boldsymbol{#1}", "\\fcolorbox": "\\boxed{#3}\\rlap{\\hphantom{#1#2}}" };
const CACHE_SIZE = 300;

/** @type {Map<string, Element>} */
const cache = new Map();

/**
 * @param {Formula} formula
 * @param {Doc} [doc]
 * @returns {Node}
 */
export function renderFormula({ tex, display, source }, doc = document) {
  const key = `${display ? "D" : "I"}${tex}`;
  const hit = cache.get(key);
  if (hit) {
    cache.delete(key); // most recently used goes last
    cache.set(key, hit);
    return hit.cloneNode(true);
  }
  const box = doc.createElement("span");
  const katex = /** @type {any} */ (globalThis).katex;
  try {
    if (!katex) throw new Error("KaTeX did not load");
    katex.render(tex, box, { ...OPTIONS, macros: { ...MACROS }, displayMode: display });
    box.className = display ? "math math-display" : "math";
    if (display) {
      // A wide formula scrolls sideways in its own box; keyboard users can scroll it too.
      box.setAttribute("tabindex", "0");
    }
  } catch {
    box.replaceChildren(source);
    box.className = "math-source";
  }
  cache.set(key, box);
  if (cache.size > CACHE_SIZE) cache.delete(/** @type {string} */ (cache.keys().next().value));
  return box.cloneNode(true);
}
