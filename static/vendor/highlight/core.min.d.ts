// Not from the package: the types frontend/code.js relies on, so the page's type check (frontend/jsconfig.json)
// reads this instead of type-checking the minified library.
declare const hljs: {
  registerLanguage(name: string, grammar: unknown): void;
  getLanguage(name: string): { name?: string } | undefined;
  highlight(code: string, options: { language: string; ignoreIllegals?: boolean }): { value: string; _emitter: { root: unknown } };
};
export default hljs;
