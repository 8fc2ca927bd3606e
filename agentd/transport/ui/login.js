"use strict";
// The login form of a bearer listener's /ui/ (agentd.transport.ui_app): the token goes to /ui/login, same
// origin; the answer sets the session cookie, and the page is loaded again.
document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const message = document.getElementById("message");
  const token = document.getElementById("token").value;
  try {
    const answer = await fetch("login", {method: "POST", body: token, credentials: "same-origin",
                                             headers: {"content-type": "text/plain"}});
    if (answer.ok) {
      location.replace("./");  // relative, as the page's own links
      return;
    }
    message.textContent = answer.status === 401 ? "That is not this daemon's token." : "Refused (" + answer.status + ").";
  } catch (e) {
    message.textContent = "The daemon did not answer.";
  }
});
