// The live views of a desktop or browser sandbox (gateway/ui/_live_views.py).
//
// Desktop: noVNC's client (vendor/novnc, loaded only when the tab is opened) on the UI's WebSocket, which the server
// bridges to a VNC server in the sandbox; clicks and keys on the screen go to the sandbox; closed after a minute
// unseen (another tab, a hidden window), so a forgotten view does not keep the sandbox awake. Browser: the current
// page's URL, title and a picture of it, asked for every few seconds while the tab is shown, and a URL box.
import { act, csrfToken, getJson, toast } from "./ui.js";

const BROWSER_POLL_MS = 2000;
const HIDDEN_CLOSE_MS = 60_000;
const $ = (name) => document.getElementById(name);

export function desktopTab(api) {
  const panel = document.querySelector('[data-panel="desktop"]');
  let RFB = null;
  let rfb = null; // the current connection (null: none, or being made)
  let connecting = false;
  let unseenSince = 0; // when the view was last hidden (a hidden view lets the sandbox go idle)

  async function connect() {
    if (connecting || rfb) return;
    connecting = true;
    try {
      RFB ??= (await import("./vendor/novnc/core/rfb.js")).default;
    } finally {
      connecting = false;
    }
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = new URLSearchParams({ csrf: csrfToken() });
    const socket = new WebSocket(`${scheme}://${location.host}${api}/desktop?${query}`);
    let reason = "";
    socket.addEventListener("close", (event) => { reason = event.reason; }); // before noVNC's own handler
    $("desktop").replaceChildren();
    const current = new RFB($("desktop"), socket);
    rfb = current;
    current.scaleViewport = true;
    $("desktop-status").textContent = "Connecting… (the desktop starts first if nothing started it yet)";
    $("desktop-reconnect").hidden = true;
    current.addEventListener("connect", () => {
      $("desktop").dataset.connected = "true";
      $("desktop-status").textContent = "Connected: the sandbox's screen. Click it to type there (closed when you leave)";
    });
    current.addEventListener("disconnect", () => {
      if (rfb !== current) return;
      rfb = null;
      $("desktop").dataset.connected = "false";
      $("desktop-status").textContent = reason || (unseenSince ? "Closed while not shown" : "Disconnected");
      $("desktop-reconnect").hidden = false;
    });
  }

  // A view nobody sees for HIDDEN_CLOSE_MS is closed, so that a forgotten tab does not keep the sandbox busy.
  setInterval(() => {
    const unseen = panel.hidden || document.hidden;
    if (!unseen) unseenSince = 0;
    else if (!unseenSince) unseenSince = Date.now();
    else if (rfb && Date.now() - unseenSince > HIDDEN_CLOSE_MS) rfb.disconnect();
  }, 5000);
  const start = () => connect().catch((error) => toast(error.message, "error"));
  $("desktop-reconnect").addEventListener("click", start);
  return () => {
    unseenSince = 0;
    start();
  };
}

export function browserTab(api) {
  const panel = document.querySelector('[data-panel="browser"]');
  let timer = null;
  let busy = false;

  async function refresh() {
    if (busy || panel.hidden || document.hidden) return;
    busy = true;
    try {
      const page = await getJson(`${api}/browser`);
      $("browser-title").textContent = page.title || "(no title)";
      if (document.activeElement !== $("browser-url")) $("browser-url").value = page.url;
      const shot = $("browser-shot");
      shot.src = `data:${page.image.mimeType};base64,${page.image.data}`;
      shot.dataset.url = page.url;
      shot.hidden = false;
      $("browser-status").textContent = `As of ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      $("browser-status").textContent = error.message;
    } finally {
      busy = false;
    }
  }

  $("browser-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("browser-go").disabled = true;
    try {
      await act(`${api}/browser/navigate`, { url: $("browser-url").value });
      $("browser-url").blur();
      await refresh();
    } catch (error) {
      toast(error.message, "error");
    } finally {
      $("browser-go").disabled = false;
    }
  });
  return () => {
    refresh();
    timer ??= setInterval(refresh, BROWSER_POLL_MS);
  };
}
