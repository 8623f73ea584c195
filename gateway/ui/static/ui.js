// Shared helpers of the UI's pages: DOM building (text only, never HTML from data), actions, live streams.

export const csrfToken = () => document.querySelector('meta[name="csrf-token"]')?.content ?? "";

// el("a", {href: "/x", class: "btn"}, "text", child…): strings become text nodes, so data is never parsed as HTML.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function toast(message, kind = "") {
  const box = el("div", { class: `toast ${kind}` }, message);
  document.getElementById("toasts").append(box);
  setTimeout(() => box.remove(), kind === "error" ? 7000 : 3500);
}

// A state change: POST with the session's CSRF token; the answer's `error` is thrown as an Error.
export async function act(url, body = {}) {
  const response = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrfToken() },
    body: JSON.stringify(body),
  });
  if (response.status === 401) {
    location.href = `/ui/login?next=${encodeURIComponent(location.pathname + location.search)}`;
    throw new Error("Signed out");
  }
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || `The server answered ${response.status}`);
  return answer;
}

export async function getJson(url) {
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || `The server answered ${response.status}`);
  return answer;
}

// Follow a page's event stream: `onSnapshot(data)` for each snapshot; a `gone` event calls `onGone`.
// The server's clock rides along (`now`), so relative times are computed against it.
export function live(url, onSnapshot, { onGone } = {}) {
  const indicator = document.getElementById("live");
  const source = new EventSource(url);
  const mark = (on, text) => {
    if (!indicator) return;
    indicator.classList.toggle("on", on);
    indicator.classList.toggle("off", !on);
    indicator.textContent = text;
  };
  source.addEventListener("snapshot", (event) => {
    const data = JSON.parse(event.data);
    clock.offset = data.now - Date.now() / 1000;
    mark(true, "Live");
    onSnapshot(data);
  });
  source.addEventListener("signed-out", () => {
    source.close();
    location.href = `/ui/login?next=${encodeURIComponent(location.pathname + location.search)}`;
  });
  source.addEventListener("gone", () => {
    source.close();
    mark(false, "Ended");
    onGone?.();
  });
  source.addEventListener("open", () => mark(true, "Live"));
  source.addEventListener("error", async () => {
    if (source.readyState !== EventSource.CLOSED) {
      mark(false, "Reconnecting…");
      return;
    }
    // The server refused the stream: find out why, once, rather than retrying blindly.
    const answer = await fetch(url, { credentials: "same-origin" }).catch(() => null);
    if (answer?.status === 401) {
      location.href = `/ui/login?next=${encodeURIComponent(location.pathname + location.search)}`;
    } else if (answer?.ok) {
      answer.body?.cancel();
      live(url, onSnapshot, { onGone }); // it works again (the server restarted)
    } else {
      const error = await answer?.json().catch(() => ({}));
      mark(false, "Stopped");
      toast(error?.error || "Live updates stopped; reload the page to retry.", "error");
    }
  });
  return source;
}

export const clock = { offset: 0, now: () => Date.now() / 1000 + clock.offset };

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 100 || unit === 0 ? Math.round(value) : value.toFixed(1)} ${units[unit]}`;
}

export function timestamp(seconds) {
  return new Date(seconds * 1000).toLocaleString(undefined, { hour12: false });
}

const REASONS = { idle: "idle policy", api: "paused via API", timeout: "on timeout", crash: "crashed" };

// The record's own state as the badge, with why and what the E2B API reports beneath it.
export function stateBadge(sandbox) {
  const notes = [];
  if (sandbox.pause_reason) notes.push(REASONS[sandbox.pause_reason] ?? sandbox.pause_reason);
  if (sandbox.snapshot_kind) notes.push(sandbox.snapshot_kind === "criu" ? "memory kept" : "files only");
  if (sandbox.reported !== sandbox.state) notes.push(`E2B: ${sandbox.reported}`);
  return [
    el("span", { class: `badge ${sandbox.state}`, "data-state": sandbox.state }, sandbox.state),
    notes.length ? el("span", { class: "state-note" }, notes.join(" · ")) : null,
  ];
}

export function idleSeconds(sandbox) {
  return clock.now() - sandbox.last_active;
}

export function ttlText(sandbox) {
  if (sandbox.remaining !== null) return `${duration(sandbox.remaining)} left (stopped)`;
  return `${duration(sandbox.end_at - clock.now())} left`;
}

// Ports: the template's, plus the ones this browser added for the sandbox (kept in localStorage: not secret).
export function userPorts(id) {
  try {
    return JSON.parse(localStorage.getItem(`agent-sandbox:ports:${id}`) || "[]");
  } catch {
    return [];
  }
}

export function setUserPorts(id, ports) {
  localStorage.setItem(`agent-sandbox:ports:${id}`, JSON.stringify([...new Set(ports)].sort((a, b) => a - b)));
}

export function portUrl(pattern, port, id) {
  return pattern.replace("{port}", String(port)).replace("{id}", id);
}

export function allPorts(sandbox) {
  return [...new Set([...sandbox.ports, ...userPorts(sandbox.id)])].sort((a, b) => a - b);
}

export function meter(fraction, wide = false) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  return el("div", { class: `meter${wide ? " wide" : ""}` }, el("span", { style: `width: ${pct.toFixed(1)}%` }));
}
