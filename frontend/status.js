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
 * The load in a plain sentence for a student: how much is done and about how long is left, each only where the
 * server has a basis for it ("Getting the tutor ready: 40%… about 5 s left"). The server's own words, engine
 * terms and file names, are for developers: with `developer` they follow in brackets.
 * @param {State["load"]} load
 * @param {string} [progress]
 * @param {boolean} [developer]
 */
export function loadingText({ fraction, leftS }, progress = "", developer = false) {
  let text = "Getting the tutor ready";
  if (fraction !== undefined) text += `: ${Math.floor(fraction * 100)}%`;
  text += "…";
  if (fraction !== undefined && leftS !== undefined && leftS >= 1) text += ` about ${timeLeft(leftS)} left`;
  const step = developer ? loadStep(progress) : "";
  return step ? `${text} (${step})` : text;
}

/** @param {number} seconds */
function timeLeft(seconds) {
  return seconds < 60 ? `${Math.ceil(seconds)} s` : `${Math.round(seconds / 60)} min`;
}

/**
 * @param {Pick<State, "connection" | "retryInMs"> & Partial<Pick<State, "model" | "progress" | "load">>} state
 * @param {Turn | null} live  the answer still being written, if any
 * @param {boolean} [developer]  the developer setting (developer.js): the server's load progress in its words
 * @returns {{text: string, state: "ok" | "queued" | "offline"}}
 */
export function statusLine({ connection, retryInMs, model = "", progress = "", load = {} }, live, developer = false) {
  switch (connection) {
    case "connecting":
      return { text: "Connecting…", state: "offline" };
    case "warming":
      return { text: loadingText(load, progress, developer), state: "offline" };
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
  if (live) return { text: "The tutor is writing…", state: "ok" };
  return { text: model ? `Connected · ${model}` : "Connected", state: "ok" };
}
