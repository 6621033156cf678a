// @ts-check
/**
 * The status line at the top of the page: how the connection is doing, and where the live answer stands.
 * Pure and DOM-free; the page copies the result into `#status`.
 */

/** @typedef {import("./state.js").State} State */
/** @typedef {import("./state.js").Turn} Turn */

/**
 * The note under a question the transport holds because there is no socket to send it on yet: it is kept, not
 * lost, and goes out by itself. "" once the socket is open.
 * @param {State["connection"]} connection
 */
export function heldText(connection) {
  switch (connection) {
    case "warming":
      return "Your question is kept and will be sent as soon as the tutor is ready.";
    case "full":
      return "Your question is kept and will be sent as soon as the tutor has room.";
    case "connecting":
    case "reconnecting":
      return "Your question is kept and will be sent as soon as the connection is back.";
    default:
      return "";
  }
}

/**
 * The server's load progress, shorter: a file path is cut to its name ("loading /…/model.gguf" -> "loading
 * model.gguf"); counts such as "program 6/32" stay.
 * @param {string} progress
 */
export function loadStep(progress) {
  return progress.replace(/(^|\s)[~.]{0,2}\/(?:\S*\/)?([^\s/]+)/g, "$1$2").trim();
}

/**
 * @param {Pick<State, "connection" | "retryInMs"> & Partial<Pick<State, "model" | "progress">>} state
 * @param {Turn | null} live  the answer still being written, if any
 * @returns {{text: string, state: "ok" | "queued" | "offline"}}
 */
export function statusLine({ connection, retryInMs, model = "", progress = "" }, live) {
  switch (connection) {
    case "connecting":
      return { text: "Connecting…", state: "offline" };
    case "warming": {
      const step = loadStep(progress);
      return { text: `The tutor is getting ready (loading the model${step ? `: ${step}` : ""})…`, state: "offline" };
    }
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
