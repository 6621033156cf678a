// Not from the package: see ../core.min.d.ts.
declare const grammar: unknown;
export default grammar;
