// @ts-check
/** Copying text for the Copy buttons (an answer's, a code block's), with the button saying so for a moment. */

/**
 * @param {string} text
 * @param {HTMLButtonElement} button  says "Copied" for a moment
 */
export async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No async clipboard outside a secure context: fall back to a selection and the copy command.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  button.textContent = "Copied";
  setTimeout(() => (button.textContent = "Copy"), 1500);
}
