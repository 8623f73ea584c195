// The Sessions tab: the sandbox's coding-agent sessions, one session's transcript (polled while a turn runs),
// approve / deny buttons for its permission requests, a prompt box and a form that starts a session.
//
// The list and the transcript are HTML fragments the server renders from its templates, with everything the agent
// wrote escaped there; this script only swaps them in and sends the actions (POSTs with the CSRF token).
import { act, toast } from "./ui.js";

const POLL_MS = 1000;
const AFTER_ACTION_POLLS = 5; // polls after a prompt or a reply even if the turn does not show as running yet

export function sessionsTab(api) {
  const $ = (name) => document.getElementById(name);
  const panel = document.querySelector('[data-panel="sessions"]');
  const base = `${api}/agent-sessions`;
  let open = ""; // the session shown
  let generation = 0; // a newer load makes an older answer void
  let timer = null;
  let extraPolls = 0;

  async function fragment(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (response.status === 401) {
      location.href = `/ui/login?next=${encodeURIComponent(location.pathname + location.search)}`;
      throw new Error("Signed out");
    }
    if (!response.ok) {
      const answer = await response.json().catch(() => ({}));
      throw new Error(answer.error || `The server answered ${response.status}`);
    }
    return response.text();
  }

  // Swap in a fragment of this server's own (rendered and escaped by its templates; no scripts run from it).
  function swap(container, html) {
    container.innerHTML = html;
  }

  async function loadList() {
    $("sessions-status").textContent = "Loading…";
    try {
      swap($("sessions-list"), await fragment(base));
      $("sessions-status").textContent = "";
    } catch (error) {
      $("sessions-status").textContent = error.message;
    }
  }

  async function loadTranscript() {
    clearTimeout(timer);
    if (!open) return;
    const mine = ++generation;
    const shown = open;
    try {
      const html = await fragment(`${base}/${encodeURIComponent(shown)}`);
      if (mine !== generation || shown !== open) return;
      const entries = $("transcript").querySelector(".entries");
      const atBottom = !entries || entries.scrollHeight - entries.scrollTop - entries.clientHeight < 40;
      swap($("transcript"), html);
      const after = $("transcript").querySelector(".entries");
      if (after && atBottom) after.scrollTop = after.scrollHeight;
      const body = $("transcript-body");
      $("prompt-form").hidden = body?.dataset.ended === "1";
      const live = body?.dataset.live === "1";
      if (extraPolls > 0) extraPolls -= 1;
      if ((live || extraPolls > 0) && !panel.hidden) timer = setTimeout(loadTranscript, POLL_MS);
      else loadList(); // the turn is over: the list's state and counts catch up
    } catch (error) {
      if (mine !== generation) return;
      $("sessions-status").textContent = error.message;
      if (!panel.hidden && extraPolls > 0) timer = setTimeout(loadTranscript, POLL_MS * 2);
    }
  }

  function show(sessionId) {
    open = sessionId;
    $("session-view").hidden = false;
    $("transcript").replaceChildren();
    extraPolls = 0;
    loadTranscript();
  }

  async function send(button, url, body, done) {
    if (button) button.disabled = true;
    try {
      const answer = await act(url, body);
      if (done) toast(done);
      return answer;
    } catch (error) {
      toast(error.message, "error");
      return null;
    } finally {
      if (button) button.disabled = false;
    }
  }

  panel.addEventListener("submit", async (event) => {
    const form = event.target;
    if (form.id === "session-create") {
      event.preventDefault();
      const button = form.querySelector("button[type=submit]");
      button.textContent = "Starting…";
      const agent = form.elements.agent.value;
      const answer = await send(button, base, { agent, sessionId: form.elements.sessionId.value }, null);
      button.textContent = "Start session";
      if (answer) {
        toast(`Started ${answer.sessionId} (${agent})`);
        await loadList();
        show(answer.sessionId);
        $("prompt-input").focus();
      }
    } else if (form.id === "prompt-form") {
      event.preventDefault();
      const message = $("prompt-input").value;
      if (!message.trim() || !open) return;
      const answer = await send($("prompt-send"), `${base}/${encodeURIComponent(open)}/messages`, { message }, null);
      if (answer) {
        $("prompt-input").value = "";
        extraPolls = AFTER_ACTION_POLLS;
        loadTranscript();
      }
    }
  });

  panel.addEventListener("click", async (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    if (button.dataset.openSession) {
      show(button.dataset.openSession);
    } else if (button.dataset.reply && open) {
      const url = `${base}/${encodeURIComponent(open)}/permissions/${encodeURIComponent(button.dataset.permission)}`;
      const label = button.dataset.reply === "reject" ? "Denied" : "Approved";
      if (await send(button, url, { reply: button.dataset.reply }, label)) {
        extraPolls = AFTER_ACTION_POLLS;
        loadTranscript();
      }
    } else if (button.dataset.terminate) {
      if (!confirm(`Terminate session ${button.dataset.terminate}? Its agent process ends.`)) return;
      const url = `${base}/${encodeURIComponent(button.dataset.terminate)}/terminate`;
      if (await send(button, url, {}, "Terminated")) {
        loadTranscript();
        loadList();
      }
    }
  });

  $("prompt-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("prompt-form").requestSubmit();
  });
  $("sessions-refresh").addEventListener("click", () => {
    loadList();
    loadTranscript();
  });

  // Opening the tab (again) reloads; leaving it stops the polling at its next round.
  return () => {
    loadList();
    loadTranscript();
  };
}
