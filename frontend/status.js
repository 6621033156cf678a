// @ts-check
/**
 * The status line at the top of the page: how the connection is doing, and where the live answer stands.
 * Pure and DOM-free; the page copies the result into `#status`.
 */

/** @typedef {import("./state.js").State} State */
/** @typedef {import("./state.js").Turn} Turn */

/**
 * @param {Pick<State, "connection" | "retryInMs"> & Partial<Pick<State, "model">>} state
 * @param {Turn | null} live  the answer still being written, if any
 * @returns {{text: string, state: "ok" | "queued" | "offline"}}
 */
export function statusLine({ connection, retryInMs, model = "" }, live) {
  switch (connection) {
    case "connecting":
      return { text: "Connecting…", state: "offline" };
    case "warming":
      return { text: "The tutor is getting ready (loading the model)…", state: "offline" };
    case "full":
      return {
        text: `The tutor has as many students connected as it can take. Trying again in ${Math.ceil(retryInMs / 1000)} s…`,
        state: "offline",
      };
    case "reconnecting":
      return {
        text: retryInMs > 0 ? `Connection lost. Reconnecting in ${Math.ceil(retryInMs / 1000)} s…` : "Reconnecting…",
        state: "offline",
      };
  }
  if (live?.status === "queued" && live.note) return { text: live.note, state: "queued" };
  if (live) return { text: "The tutor is writing…", state: "ok" };
  return { text: model ? `Connected · ${model}` : "Connected", state: "ok" };
}
