// One sandbox's page: live state and figures, actions, port URLs, logs, processes, files, a terminal, the
// coding-agent sessions (agent_sessions.js), and a desktop's or a browser's live view (live_views.js).
import { Terminal } from "./vendor/xterm/xterm.js";
import { FitAddon } from "./vendor/addon-fit/addon-fit.js";
import {
  act, allPorts, bytes, clock, csrfToken, duration, el, getJson, idleSeconds, live, portUrl, setUserPorts,
  stateBadge, timestamp, toast, ttlText, userPorts,
} from "./ui.js";
import { sessionsTab } from "./agent_sessions.js";
import { browserTab, desktopTab } from "./live_views.js";

const root = document.getElementById("sandbox");
const id = root.dataset.id;
const api = `/ui/api/sandboxes/${id}`;
const pattern = root.dataset.urlPattern;
const $ = (name) => document.getElementById(name);
let current = null; // the latest snapshot's sandbox
let logsKey = "";
let urlsKey = "";

// --- live summary -------------------------------------------------------------------------------------------

function renderSummary() {
  const s = current;
  if (!s) return;
  $("state").replaceChildren(...stateBadge(s).filter(Boolean).slice(0, 1));
  $("state-note").textContent = stateBadge(s)[1]?.textContent ?? "";
  $("cpu").textContent = s.cpu_pct === null ? "–" : `${s.cpu_pct.toFixed(1)}%`;
  $("cpu-note").textContent = `${s.cpu_count} vCPU`;
  $("memory").textContent = s.mem_used === null ? "–" : bytes(s.mem_used);
  $("memory-note").textContent = `of ${bytes(s.mem_total)}`;
  $("idle").textContent = duration(idleSeconds(s));
  $("age").textContent = `created ${duration(clock.now() - s.created_at)} ago`;
  $("ttl").textContent = ttlText(s);
  $("ttl-note").textContent = `then ${s.on_timeout}${s.auto_resume ? " · wakes on traffic" : ""}`;
  $("subtitle").textContent = `${s.template}${s.alias !== s.template ? ` (as ${s.alias})` : ""} · created ${timestamp(s.created_at)}`;
  $("pause").hidden = s.reported !== "running";
  $("resume").hidden = s.reported === "running";
}

function renderDetails() {
  const s = current;
  const rows = [
    ["Template", s.template],
    ["Internal state", `${s.state}${s.pause_reason ? ` (${s.pause_reason})` : ""}${s.snapshot_kind ? `, snapshot: ${s.snapshot_kind}` : ""}`],
    ["E2B state", s.reported],
    ...(s.crash ? [["Crashed", `${s.crash}; its files are kept until it is killed, and a connect starts it again`]] : []),
    ["Created", timestamp(s.created_at)],
    ["Last started", timestamp(s.started_at)],
    ["On timeout", s.on_timeout + (s.auto_resume ? ", auto-resume" : "")],
    ["Metadata", Object.keys(s.metadata).length
      ? Object.entries(s.metadata).map(([k, v]) => el("span", { class: "chip" }, `${k}=${v}`))
      : el("span", { class: "muted" }, "none")],
  ];
  $("details").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function renderUrls() {
  const ports = allPorts(current);
  const key = JSON.stringify(ports);
  if (key === urlsKey) return;
  urlsKey = key;
  const own = new Set(userPorts(id));
  $("urls").replaceChildren(...(ports.length ? ports.map((port) => {
    const url = portUrl(pattern, port, id);
    const remove = own.has(port) && !current.ports.includes(port)
      ? el("button", {
        class: "btn btn-small btn-quiet", type: "button", title: "Remove",
        onclick: () => { setUserPorts(id, userPorts(id).filter((p) => p !== port)); urlsKey = ""; renderUrls(); },
      }, "Remove")
      : el("span", { class: "chip" }, "template");
    return el("li", { "data-port": port }, el("span", { class: "port" }, `:${port}`),
      el("a", { href: url, target: "_blank", rel: "noopener", class: "port-url" }, url), remove);
  }) : [el("li", { class: "none" }, "No ports yet: add the port a server in the sandbox listens on.")]));
}

function renderLogs(logs) {
  const key = JSON.stringify(logs.at(-1) ?? null) + logs.length;
  if (key === logsKey) return;
  logsKey = key;
  const list = $("logs");
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 8;
  list.replaceChildren(...(logs.length ? logs.map(([ts, level, message]) => el("li", {},
    el("span", { class: "ts" }, timestamp(ts)), el("span", { class: `level-${level}` }, level), el("span", {}, message)))
    : [el("li", { class: "muted" }, "No lifecycle events yet.")]));
  if (atBottom) list.scrollTop = list.scrollHeight;
}

live(root.dataset.events, (data) => {
  current = data.sandbox;
  renderSummary();
  renderDetails();
  renderUrls();
  renderLogs(data.logs);
}, {
  onGone: () => {
    $("gone").hidden = false;
    for (const name of ["summary", "pause", "resume", "extend-form", "kill"]) $(name).hidden = true;
  },
});
setInterval(renderSummary, 1000);

// --- actions ------------------------------------------------------------------------------------------------

async function run(button, action, body, done) {
  button.disabled = true;
  try {
    await act(`${api}/${action}`, body);
    toast(done);
  } catch (error) {
    toast(error.message, "error");
  } finally {
    button.disabled = false;
  }
}

$("pause").addEventListener("click", (e) => {
  socket?.close(); // the shell would not survive the snapshot; the terminal offers to reconnect after a resume
  run(e.currentTarget, "pause", {}, "Pausing: the sandbox is snapshotted");
});
$("resume").addEventListener("click", (e) => run(e.currentTarget, "resume", {}, "Resuming"));
$("extend-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const seconds = Number($("extend-seconds").value);
  run($("extend"), "timeout", { seconds }, `Kept alive for at least ${duration(seconds)} more`);
});
$("kill").addEventListener("click", async (e) => {
  if (!confirm(`Kill sandbox ${id}? Its files and processes are lost.`)) return;
  await run(e.currentTarget, "kill", {}, `Killed ${id}`);
});
$("port-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const port = Number($("port-input").value);
  if (!Number.isInteger(port) || port < 1 || port > 65535) return;
  setUserPorts(id, [...userPorts(id), port]);
  $("port-input").value = "";
  urlsKey = "";
  if (current) renderUrls();
});

// --- tabs ---------------------------------------------------------------------------------------------------

const opened = new Set();
const openSessions = sessionsTab(api);
const onOpen = { terminal: openTerminal, processes: loadProcesses, files: () => loadFiles("."), sessions: openSessions };
if ($("desktop")) onOpen.desktop = desktopTab(api);
if ($("browser-form")) onOpen.browser = browserTab(api);

for (const tab of document.querySelectorAll("[role=tab]")) {
  tab.addEventListener("click", () => {
    for (const other of document.querySelectorAll("[role=tab]")) other.setAttribute("aria-selected", String(other === tab));
    for (const panel of document.querySelectorAll(".tab-panel")) panel.hidden = panel.dataset.panel !== tab.dataset.tab;
    const name = tab.dataset.tab;
    if (!opened.has(name)) {
      opened.add(name);
      onOpen[name]?.();
    } else if (name === "terminal") {
      fit?.fit();
    } else if (name === "sessions" || name === "desktop" || name === "browser") {
      onOpen[name]();
    }
  });
}

// --- processes ----------------------------------------------------------------------------------------------

async function loadProcesses() {
  $("processes-status").textContent = "Loading…";
  try {
    const { processes } = await getJson(`${api}/processes`);
    $("processes-table").querySelector("tbody").replaceChildren(...(processes.length ? processes.map((p) => el("tr", {},
      el("td", { class: "num" }, p.pid), el("td", {}, el("code", {}, [p.cmd, ...p.args].join(" "))),
      el("td", {}, el("code", {}, p.cwd ?? "")), el("td", {}, p.tag ?? ""))) : [el("tr", {}, el("td", { colspan: 4, class: "muted" }, "No processes."))]));
    $("processes-status").textContent = `${processes.length} process${processes.length === 1 ? "" : "es"} started through the executor`;
  } catch (error) {
    $("processes-status").textContent = error.message;
  }
}
$("processes-refresh").addEventListener("click", loadProcesses);

// --- files --------------------------------------------------------------------------------------------------

let filesPath = ".";

function parentOf(path) {
  const trimmed = path.replace(/\/+$/, "");
  const cut = trimmed.lastIndexOf("/");
  return cut <= 0 ? "/" : trimmed.slice(0, cut);
}

async function loadFiles(path) {
  $("files-status").textContent = "Loading…";
  try {
    const { entries } = await getJson(`${api}/files?path=${encodeURIComponent(path)}`);
    const shown = entries.length ? parentOf(entries[0].path) : path;
    filesPath = shown;
    $("files-path").textContent = shown;
    const rows = [];
    if (shown !== "/") {
      rows.push(el("tr", {}, el("td", { colspan: 5 }, el("a", { href: "#", onclick: (e) => { e.preventDefault(); loadFiles(parentOf(shown)); } }, "↑ .."))));
    }
    for (const entry of entries) {
      const isDir = entry.type === "directory";
      const name = isDir
        ? el("a", { href: "#", "data-dir": entry.path, onclick: (e) => { e.preventDefault(); loadFiles(entry.path); } }, `${entry.name}/`)
        : el("span", {}, entry.name, entry.target ? el("span", { class: "muted" }, ` → ${entry.target}`) : null);
      const download = isDir ? "" : el("a", { class: "btn btn-small", href: `${api}/download?path=${encodeURIComponent(entry.path)}`, download: entry.name }, "Download");
      rows.push(el("tr", { "data-path": entry.path }, el("td", {}, name), el("td", { class: "num" }, isDir ? "–" : bytes(entry.size)),
        el("td", {}, el("code", {}, entry.permissions)), el("td", { class: "num" }, entry.modified ? new Date(entry.modified).toLocaleString(undefined, { hour12: false }) : ""),
        el("td", { class: "actions" }, download)));
    }
    $("files-table").querySelector("tbody").replaceChildren(...rows);
    $("files-status").textContent = `${entries.length} entr${entries.length === 1 ? "y" : "ies"}`;
  } catch (error) {
    $("files-status").textContent = error.message;
  }
}
$("files-refresh").addEventListener("click", () => loadFiles(filesPath));

// --- terminal -----------------------------------------------------------------------------------------------

let term = null;
let fit = null;
let socket = null;

function openTerminal() {
  if (!term) {
    term = new Terminal({
      cursorBlink: true, fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, monospace', fontSize: 13,
      theme: { background: "#0f172a", foreground: "#e2e8f0", cursor: "#a5b4fc" },
    });
    fit = new FitAddon();
    term.loadAddon(fit);
    term.open($("terminal"));
    term.onData((data) => socket?.readyState === WebSocket.OPEN && socket.send(new TextEncoder().encode(data)));
    term.onResize(({ cols, rows }) => socket?.readyState === WebSocket.OPEN && socket.send(JSON.stringify({ cols, rows })));
    window.addEventListener("resize", () => fit.fit());
  }
  fit.fit();
  connect();
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = new URLSearchParams({ csrf: csrfToken(), cols: term.cols, rows: term.rows });
  socket = new WebSocket(`${scheme}://${location.host}${api}/terminal?${query}`);
  socket.binaryType = "arraybuffer";
  $("terminal-status").textContent = "Connecting…";
  $("terminal-reconnect").hidden = true;
  let ended = "";
  socket.addEventListener("open", () => {
    $("terminal-status").textContent = "Connected: a login shell in the sandbox (closed when you leave)";
    term.focus();
  });
  socket.addEventListener("message", (event) => {
    if (typeof event.data !== "string") {
      term.write(new Uint8Array(event.data));
      return;
    }
    const message = JSON.parse(event.data);
    ended = message.error ?? `The shell ended: ${message.exit}`;
  });
  socket.addEventListener("close", () => {
    $("terminal-status").textContent = ended || "Disconnected";
    $("terminal-reconnect").hidden = false;
  });
}
$("terminal-reconnect").addEventListener("click", () => {
  term.reset();
  connect();
});
