import assert from "node:assert/strict";
import { test } from "node:test";

import { highlightCode, languageName, scopeClass } from "../../frontend/code.js";
import { parseBlocks } from "../../frontend/markdown.js";
import { renderBlock } from "../../frontend/render.js";
import { fakeDocument, html } from "./fake-dom.mjs";

const SCHOOL = {
  python: 'def area(r):\n    """Circle."""\n    return 3.14 * r ** 2  # cm²',
  javascript: "const xs = [1, 2];\nconsole.log(`sum ${xs.reduce((a, b) => a + b)}`);",
  java: 'public class Hi { public static void main(String[] a) { System.out.println("hi"); } }',
  c: '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }',
  html: '<p class="x">Hi <b>there</b></p>\n<script>alert("still text")</script>',
  sql: "SELECT name, COUNT(*) FROM pupils WHERE age > 11 GROUP BY name;",
};

for (const [lang, source] of Object.entries(SCHOOL)) {
  test(`${lang} is coloured with spans and Text nodes only, every character kept`, () => {
    const nodes = highlightCode(source, lang, fakeDocument);
    assert.ok(nodes, `${lang} is not known`);
    const box = fakeDocument.createElement("code");
    box.append(...nodes);
    assert.equal(box.textContent, source);
    const tags = new Set([...box.descendants()].map((n) => n.tagName));
    assert.deepEqual([...tags], ["SPAN"], `${lang}: ${[...tags]}`);
    assert.ok([...box.descendants()].some((n) => /^hljs-(keyword|tag|name|meta)/.test(n.className)), html(box));
  });
}

test("an unknown language is left plain; the caption names the language", () => {
  assert.equal(highlightCode("x", "klingon", fakeDocument), null);
  assert.equal(languageName("py"), "Python");
  assert.equal(languageName("html"), "HTML");
  assert.equal(languageName("Java"), "Java");
  assert.equal(languageName("klingon"), "klingon");
});

test("scope names become highlight.js's class names, and nothing else", () => {
  assert.equal(scopeClass("title.function.invoke"), "hljs-title function_ invoke__");
  assert.equal(scopeClass("language:css"), "language-css");
  assert.equal(scopeClass('keyword" onclick="x'), "hljs-keywordonclickx");
});

test("a code block has a caption with its language and a Copy button", () => {
  const extras = { code: (t, l, d) => highlightCode(t, l, d), label: languageName };
  const [block] = parseBlocks("```py\nprint(1)\n```");
  const out = html(renderBlock(block, fakeDocument, extras));
  assert.match(out, /^<figure class="code"><figcaption><span class="code-lang">Python<\/span><button class="code-copy" type="button" aria-label="Copy the Python code">Copy<\/button><\/figcaption>/);
  assert.match(out, /<pre><code class="language-py"><span class="hljs-built_in">print<\/span>\(<span class="hljs-number">1<\/span>\)<\/code><\/pre><\/figure>$/);
  const plain = html(renderBlock(parseBlocks("```\nx\n```")[0], fakeDocument, extras));
  assert.match(plain, /<span class="code-lang"><\/span><button class="code-copy" type="button" aria-label="Copy the code">Copy<\/button>/);
});
