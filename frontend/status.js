// @ts-check
/**
 * The status line at the top of the page: how the connection is doing, and where the live answer stands.
 * Pure and DOM-free; the page copies the result into `#status`.
 */

/** @typedef {import("./state.js").State} State */
/** @typedef {import("./state.js").Turn} Turn */

/**
 * @param {Pick<State, "connection" | "retryInMs">} state
 * @param {Turn | null} live  the answer still being written, if any
 * @returns {{text: string, state: "ok" | "queued" | "offline"}}
 */
export function statusLine({ connection, retryInMs }, live) {
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
      // The answer is resumed once the socket is back (reconnect.js): a quiet note, no countdown to watch.
      if (live?.status === "streaming") return { text: "Reconnecting… the answer will go on where it stopped.", state: "offline" };
      return {
        text: retryInMs > 0 ? `Connection lost. Reconnecting in ${Math.ceil(retryInMs / 1000)} s…` : "Reconnecting…",
        state: "offline",
      };
  }
  if (live?.status === "queued" && live.note) return { text: live.note, state: "queued" };
  return { text: live ? "The tutor is writing…" : "Connected", state: "ok" };
}
