// @ts-check
/**
 * The developer setting: figures a student does not need (how long the first character took, how fast text
 * arrived) are shown only with it. `?dev=1` in the page's address turns it on and keeps it on in this browser,
 * `?dev=0` turns it off.
 */

export const DEVELOPER_KEY = "typewriter.dev";

/**
 * Whether developer figures are shown, after applying a `dev` query flag to what the browser kept.
 * @param {string} search  location.search
 * @param {Pick<Storage, "getItem" | "setItem" | "removeItem">} storage
 * @returns {boolean}
 */
export function developerMode(search, storage) {
  const flag = new URLSearchParams(search).get("dev");
  try {
    if (flag === "1") storage.setItem(DEVELOPER_KEY, "1");
    else if (flag === "0") storage.removeItem(DEVELOPER_KEY);
    return storage.getItem(DEVELOPER_KEY) === "1";
  } catch {
    return flag === "1"; // storage switched off: the flag holds for this page only
  }
}
