// The Sandboxes page: a live table of the key's sandboxes, with actions.
import {
  act, allPorts, bytes, duration, el, idleSeconds, clock, live, meter, portUrl, stateBadge, toast,
} from "./ui.js";

const root = document.getElementById("sandboxes");
const table = document.getElementById("sandbox-table");
const body = table.querySelector("tbody");
const pattern = root.dataset.urlPattern;
let latest = null;
let rows = new Map(); // id -> {key, tr}: a row is rebuilt only when its sandbox changed, so buttons keep their state

async function run(button, url, done) {
  button.disabled = true;
  try {
    await act(url);
    toast(done);
  } catch (error) {
    toast(error.message, "error");
  } finally {
    button.disabled = false;
  }
}

function actions(sandbox) {
  const base = `/ui/api/sandboxes/${sandbox.id}`;
  const cell = el("td", { class: "actions" });
  if (sandbox.reported === "running") {
    cell.append(el("button", {
      class: "btn btn-small", type: "button", "data-action": "pause",
      onclick: (e) => run(e.currentTarget, `${base}/pause`, `Pausing ${sandbox.id}`),
    }, "Pause"));
  } else {
    cell.append(el("button", {
      class: "btn btn-small btn-primary", type: "button", "data-action": "resume",
      onclick: (e) => run(e.currentTarget, `${base}/resume`, `Resuming ${sandbox.id}`),
    }, "Resume"));
  }
  cell.append(el("button", {
    class: "btn btn-small btn-danger", type: "button", "data-action": "kill",
    onclick: (e) => {
      if (confirm(`Kill sandbox ${sandbox.id}? Its files and processes are lost.`)) {
        run(e.currentTarget, `${base}/kill`, `Killed ${sandbox.id}`);
      }
    },
  }, "Kill"));
  return cell;
}

function row(sandbox) {
  const cpu = sandbox.cpu_pct;
  const memFraction = sandbox.mem_used === null ? 0 : sandbox.mem_used / sandbox.mem_total;
  const ports = allPorts(sandbox);
  return el("tr", { "data-id": sandbox.id, "data-state": sandbox.state },
    el("td", {}, el("a", { class: "id-link", href: `/ui/sandboxes/${sandbox.id}` }, sandbox.id)),
    el("td", {}, stateBadge(sandbox)),
    el("td", {}, sandbox.template,
      sandbox.alias !== sandbox.template ? el("span", { class: "state-note" }, `as ${sandbox.alias}`) : null),
    el("td", {}, Object.entries(sandbox.metadata).map(([k, v]) => el("span", { class: "chip" }, `${k}=${v}`))),
    el("td", { class: "num", "data-since": sandbox.created_at }, duration(clock.now() - sandbox.created_at)),
    el("td", { class: "num", "data-since": sandbox.last_active }, duration(idleSeconds(sandbox))),
    el("td", { class: "num" }, cpu === null ? "–" : `${cpu.toFixed(1)}%`,
      el("span", { class: "state-note" }, `${sandbox.cpu_count} vCPU`)),
    el("td", { class: "num" }, sandbox.mem_used === null ? "–" : bytes(sandbox.mem_used),
      sandbox.mem_used === null ? null : meter(memFraction)),
    el("td", {}, ports.length
      ? ports.map((port) => el("div", {}, el("a", { href: portUrl(pattern, port, sandbox.id), target: "_blank", rel: "noopener" }, `:${port}`)))
      : el("span", { class: "muted" }, "–")),
    actions(sandbox),
  );
}

function render() {
  if (latest === null) return;
  const sandboxes = latest.sandboxes;
  document.getElementById("loading").hidden = true;
  document.getElementById("count").textContent = sandboxes.length ? String(sandboxes.length) : "";
  table.hidden = sandboxes.length === 0;
  const filtered = Boolean(root.dataset.filtered);
  document.getElementById("empty").hidden = sandboxes.length > 0 || filtered;
  document.getElementById("empty-filtered").hidden = sandboxes.length > 0 || !filtered;
  const next = new Map();
  const trs = sandboxes.map((sandbox) => {
    const key = JSON.stringify([sandbox, allPorts(sandbox)]);
    const old = rows.get(sandbox.id);
    const tr = old && old.key === key ? old.tr : row(sandbox);
    next.set(sandbox.id, { key, tr });
    return tr;
  });
  rows = next;
  body.replaceChildren(...trs);
}

function tick() {
  for (const cell of body.querySelectorAll("[data-since]")) {
    cell.textContent = duration(clock.now() - Number(cell.dataset.since));
  }
}

live(root.dataset.events, (data) => {
  latest = data;
  render();
});
setInterval(tick, 1000); // ages and idle times tick between snapshots
