#!/usr/bin/env node
// Drives a sandbox-agent 0.4.2 compatible server with the real `sandbox-agent@0.4.2` TypeScript SDK (installed by
// scripts/install-sandbox-agent-sdk) and prints one JSON object on stdout with everything it observed.
//
//   node tests/js/sandbox_agent_flow.mjs '<json-config>'     (or the path of a JSON file)
//
// Config keys (only baseUrl is required):
//   baseUrl        server URL, e.g. "http://127.0.0.1:2468"
//   token          bearer token, or null for none
//   agent          agent id for createSession (default "mock")
//   prompt         prompt text (default "Say hello")
//   permission     how to answer session/request_permission: "once" | "always" | "reject" | "cancel" | null.
//                  null registers no listener, so the SDK itself answers {outcome:{outcome:"cancelled"}}.
//   cwd            session cwd and directory of the fs round-trip file (default "/home/user")
//   mode, model, thoughtLevel   passed to createSession when set
//   steps          which checks to run, in this fixed order: health, agents, createSession, prompt, fs, process,
//                  processLogs, acpServers, destroySession, dispose. Default: all but processLogs.
//                  Aliases: session = createSession, destroy = destroySession, listAgents = agents,
//                  listAcpServers = acpServers.
//   timeoutMs      overall deadline for the whole run (default 30000); a hang anywhere becomes an error
//   requestTimeoutMs  per-HTTP-request timeout for non-SSE requests (default: timeoutMs)
//   settleMs       quiet period to wait for trailing session events after prompt / destroy (default 150)
//   headers        extra HTTP headers for every request
//   logLimit       at most this many entries are kept in http, acpPosts and events (default 500); the number
//                  left out is reported as <name>Dropped
//   fsPath, fsContent, processCommand, processArgs   override the fs / process checks
//   destroyWhenToolRuns  if true, destroySession is called (once, while the prompt is still running) as soon as a
//                  tool call is reported in_progress; what it did is reported as destroyedWhileToolRan
//
// On success it prints {"ok": true, ...} and exits 0. Keys: health, agents [{id, installed, credentialsAvailable}],
// agentIds, sessionId, session {id, agentSessionId, connectionId, modes?, configOptionIds?}, stopReason, usage?,
// agentText (agent_message_chunk texts joined),
// events [{index, sender, method?, id?, response?, sessionUpdate?, toolCallId?, status?}],
// eventMethods (method, or "result"/"error" for responses, in order), sessionUpdates (kinds in order), eventCount,
// toolCalls [{toolCallId, title, statuses}] (each tool call's statuses in order, from tool_call and tool_call_update),
// permissions [{id, options, availableReplies, toolCall, answer, optionId, answered | answerError}],
// fs {path, write, readBack, match, listed, stat, deleted}, process (the runProcess answer), processStdout,
// processLogs?, acpServers, destroyed, timings {<step>: ms} (createSession and prompt among them), stepsRun,
// http [{method, path, accept, contentType, authorization, status, ...}] and acpPosts [{t_ms, url, body}]
// (every JSON-RPC envelope the SDK POSTed), warnings.
// On failure: {"error": "<message>", "stage": "<where>", "errorDetails": {...}, "observed": {...so far}}, exit 1.
// Session events are only those the SDK ties to the session: initialize and the client's answers to agent
// requests (e.g. the permission reply) do not appear there, but do in acpPosts.
// SDK diagnostics (console.*) go to stderr, never stdout.
import { readFileSync, writeSync } from "node:fs";
import path from "node:path";
import { randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";

console.log = (...args) => console.error(...args); // keep stdout for the single JSON result
console.info = console.log;
console.debug = console.log;

const t0 = performance.now();
const elapsed = () => Math.round(performance.now() - t0);

const observed = {
  ok: false,
  node: process.version,
  stepsRun: [],
  timings: {},
  warnings: [],
  http: [],
  acpPosts: [],
};
let stage = "config";
let finished = false;

/** Writes the one result line synchronously (retrying on EAGAIN for non-blocking pipes) and exits. */
function emit(obj, code) {
  if (finished) return;
  finished = true;
  const data = Buffer.from(`${JSON.stringify(obj)}\n`);
  let offset = 0;
  while (offset < data.length) {
    try {
      offset += writeSync(1, data, offset);
    } catch (err) {
      if (err.code !== "EAGAIN") throw err;
    }
  }
  process.exit(code);
}

function describeError(err) {
  if (!(err instanceof Error)) return { message: String(err) };
  const details = { name: err.name };
  let message = err.message || String(err);
  if (typeof err.status === "number") {
    details.status = err.status;
    if (err.problem) details.problem = err.problem;
    const detail = err.problem?.detail;
    message = `${message} (HTTP ${err.status}${detail ? `: ${detail}` : ""})`;
  }
  if (typeof err.code === "number" || typeof err.code === "string") details.code = err.code;
  if (err.data !== undefined) details.data = err.data;
  if (err.cause) {
    details.cause = String(err.cause?.message ?? err.cause);
    if (err.cause?.code) details.causeCode = err.cause.code;
    message = `${message} (${details.causeCode ?? details.cause})`;
  }
  return { message, details };
}

function fail(err, where = stage) {
  const { message, details } = describeError(err);
  observed.elapsedMs = elapsed();
  emit({ error: message, stage: where, errorDetails: details, observed }, 1);
}

process.on("uncaughtException", (err) => fail(err, `${stage} (uncaught)`));
process.on("unhandledRejection", (reason) => {
  observed.warnings.push(`unhandled rejection during ${stage}: ${describeError(reason).message}`);
});

// ---- config -------------------------------------------------------------------------------------------------
const STEP_ORDER = [
  "health",
  "agents",
  "createSession",
  "prompt",
  "fs",
  "process",
  "processLogs",
  "acpServers",
  "destroySession",
  "dispose",
];
const DEFAULT_STEPS = STEP_ORDER.filter((s) => s !== "processLogs");
const ALIASES = {
  session: "createSession",
  destroy: "destroySession",
  listAgents: "agents",
  listAcpServers: "acpServers",
  getHealth: "health",
  runProcess: "process",
};

let cfg;
try {
  const arg = process.argv[2];
  if (!arg) throw new Error("usage: node sandbox_agent_flow.mjs '<json-config>' | <config.json>");
  cfg = JSON.parse(arg.trimStart().startsWith("{") ? arg : readFileSync(arg, "utf8"));
  if (typeof cfg.baseUrl !== "string" || !cfg.baseUrl) throw new Error("config.baseUrl is required");
} catch (err) {
  fail(err, "config");
}

const timeoutMs = Number(cfg.timeoutMs ?? 30000);
const requestTimeoutMs = Number(cfg.requestTimeoutMs ?? timeoutMs);
const settleMs = Number(cfg.settleMs ?? 150);
const agent = cfg.agent ?? "mock";
const promptText = cfg.prompt ?? "Say hello";
const permission = cfg.permission ?? null;
const cwd = cfg.cwd ?? "/home/user";
const token = cfg.token ?? undefined;
const logLimit = Number(cfg.logLimit ?? 500);

/** Appends to one of the capped logs (http, acpPosts, events) and returns the entry. */
function appendLog(name, entry) {
  const list = observed[name];
  if (list.length < logLimit) list.push(entry);
  else observed[`${name}Dropped`] = (observed[`${name}Dropped`] ?? 0) + 1;
  return entry;
}

let steps;
try {
  const requested = (cfg.steps ?? DEFAULT_STEPS).map((s) => ALIASES[s] ?? s);
  const unknown = requested.filter((s) => !STEP_ORDER.includes(s));
  if (unknown.length) throw new Error(`unknown steps ${JSON.stringify(unknown)}; known: ${STEP_ORDER.join(", ")}`);
  steps = new Set(requested);
  if ((steps.has("prompt") || steps.has("destroySession")) && !steps.has("createSession")) {
    throw new Error("steps prompt / destroySession need createSession");
  }
  if (permission !== null && !["once", "always", "reject", "cancel"].includes(permission)) {
    throw new Error(`config.permission must be once|always|reject|cancel|null, got ${JSON.stringify(permission)}`);
  }
} catch (err) {
  fail(err, "config");
}
Object.assign(observed, { baseUrl: cfg.baseUrl, agent, cwd, permissionPolicy: permission });

// Overall watchdog: fires even when something blocks outside a step.
setTimeout(() => fail(new Error(`overall timeout of ${timeoutMs} ms exceeded`)), timeoutMs + 1000).unref();

const remaining = () => Math.max(0, timeoutMs - (performance.now() - t0));

async function withDeadline(name, promise) {
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${name} timed out (overall deadline of ${timeoutMs} ms reached)`)),
      remaining(),
    );
  });
  try {
    return await Promise.race([promise, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** Runs one step (if selected) under the overall deadline and records its duration. */
async function step(name, fn) {
  if (!steps.has(name)) return undefined;
  stage = name;
  const started = performance.now();
  try {
    return await withDeadline(name, fn());
  } finally {
    observed.timings[name] = Math.round(performance.now() - started);
    observed.stepsRun.push(name);
  }
}

/** Sets a finer-grained stage name inside a step and applies the deadline to one call. */
function sub(name, promise) {
  stage = name;
  return withDeadline(name, promise);
}

/** Waits until no session event arrived for settleMs (bounded by 10 * settleMs and the deadline). */
async function settle(events) {
  const limit = performance.now() + Math.min(settleMs * 10, remaining());
  let count = -1;
  while (count !== events.length && performance.now() < limit) {
    count = events.length;
    await new Promise((r) => setTimeout(r, settleMs));
  }
}

// ---- HTTP wrapper: per-request timeout + a log of what the SDK sends ------------------------------------------
function redactAuth(value) {
  if (!value) return null;
  return token ? value.replace(token, "<token>") : value;
}

async function loggingFetch(input, init = {}) {
  const url = new URL(typeof input === "string" || input instanceof URL ? input : input.url);
  const method = (init.method ?? input.method ?? "GET").toUpperCase();
  const headers = new Headers(init.headers ?? input.headers);
  const accept = headers.get("accept");
  const isSse = (accept ?? "").includes("text/event-stream");
  const signals = [init.signal].filter(Boolean);
  if (!isSse) signals.push(AbortSignal.timeout(requestTimeoutMs));
  const signal = signals.length > 1 ? AbortSignal.any(signals) : signals[0];
  const entry = {
    t_ms: elapsed(),
    method,
    path: url.pathname + url.search,
    accept,
    contentType: headers.get("content-type"),
    authorization: redactAuth(headers.get("authorization")),
  };
  if (headers.get("last-event-id")) entry.lastEventId = headers.get("last-event-id");
  appendLog("http", entry);
  if (method === "POST" && url.pathname.startsWith("/v1/acp/") && typeof init.body === "string") {
    let body;
    try {
      body = JSON.parse(init.body);
    } catch {
      body = init.body;
    }
    appendLog("acpPosts", { t_ms: entry.t_ms, url: `acp/${url.pathname.slice("/v1/acp/".length)}${url.search}`, body });
    observed.acpServerId ??= decodeURIComponent(url.pathname.slice("/v1/acp/".length));
  }
  try {
    const response = await fetch(url, { ...init, headers, signal });
    entry.status = response.status;
    entry.responseContentType = response.headers.get("content-type");
    entry.ms = elapsed() - entry.t_ms;
    return response;
  } catch (err) {
    entry.error = describeError(err).message;
    entry.ms = elapsed() - entry.t_ms;
    if (!isSse && err?.name === "TimeoutError") {
      throw new Error(`${method} ${entry.path} timed out after ${requestTimeoutMs} ms`);
    }
    throw err;
  }
}

// ---- helpers for session observations -----------------------------------------------------------------------
function summarizeEvent(ev) {
  const p = ev.payload ?? {};
  const out = { index: ev.eventIndex, sender: ev.sender };
  if ("method" in p) out.method = p.method;
  if (p.id !== undefined) out.id = p.id;
  if (!("method" in p)) {
    out.response = "error" in p ? "error" : "result";
    if ("error" in p) out.error = p.error;
  }
  const update = p.method === "session/update" ? p.params?.update : undefined;
  if (update?.sessionUpdate) out.sessionUpdate = update.sessionUpdate;
  if (update?.toolCallId) out.toolCallId = update.toolCallId;
  if (update?.status) out.status = update.status;
  if (p.result?.stopReason) out.stopReason = p.result.stopReason;
  return out;
}

function selectedOption(request, reply) {
  // Mirrors the SDK's permissionReplyToResponse.
  const kinds =
    reply === "once" ? ["allow_once"] : reply === "always" ? ["allow_always", "allow_once"] : ["reject_once", "reject_always"];
  for (const kind of kinds) {
    const option = request.options.find((o) => o.kind === kind);
    if (option) return option.optionId;
  }
  return null;
}

// ---- the flow ---------------------------------------------------------------------------------------------------
async function main() {
  stage = "import";
  const sdkDir = path.resolve(
    process.env.SANDBOX_AGENT_SDK_DIR ||
      process.env.AGENT_SANDBOX_SANDBOX_AGENT_SDK_DIR ||
      "/var/cache/agent-sandbox/sandbox-agent-sdk",
  );
  const pkgDir = path.join(sdkDir, "node_modules", "sandbox-agent");
  const pkg = JSON.parse(readFileSync(path.join(pkgDir, "package.json"), "utf8"));
  const entry = pkg.exports?.["."]?.import ?? pkg.main ?? "./dist/index.js";
  const { SandboxAgent } = await import(pathToFileURL(path.join(pkgDir, entry)).href);
  observed.sdkVersion = pkg.version;

  stage = "connect";
  const sdk = await withDeadline(
    "connect",
    SandboxAgent.connect({
      baseUrl: cfg.baseUrl,
      token,
      headers: cfg.headers,
      fetch: loggingFetch,
      ...(cfg.skipHealthCheck ? { skipHealthCheck: true } : {}),
    }),
  );

  await step("health", async () => {
    observed.health = await sdk.getHealth();
  });

  await step("agents", async () => {
    const listed = await sdk.listAgents();
    observed.agents = listed.agents.map((a) => ({
      id: a.id,
      installed: a.installed,
      credentialsAvailable: a.credentialsAvailable,
    }));
    observed.agentIds = listed.agents.map((a) => a.id);
  });

  const localId = randomUUID();
  observed.events = [];
  const events = observed.events; // summaries, capped by logLimit
  let eventCount = 0; // all events, also those beyond the cap (settle() watches this)
  const eventsSeen = {
    get length() {
      return eventCount;
    },
  };
  const textChunks = [];
  const permissions = [];
  const toolCalls = [];
  let session;

  await step("createSession", async () => {
    // Subscribe before createSession (with our own local id) so session/new and its answer are seen too.
    sdk.onSessionEvent(localId, (ev) => {
      try {
        eventCount += 1;
        appendLog("events", summarizeEvent(ev));
        const update = ev.payload?.method === "session/update" ? ev.payload.params?.update : undefined;
        if (update?.sessionUpdate === "agent_message_chunk" && update.content?.type === "text") {
          textChunks.push(update.content.text);
        }
        if (update?.sessionUpdate === "tool_call" || update?.sessionUpdate === "tool_call_update") {
          let call = toolCalls.find((c) => c.toolCallId === update.toolCallId);
          if (!call) {
            call = { toolCallId: update.toolCallId, title: null, statuses: [] };
            toolCalls.push(call);
          }
          if (update.title) call.title = update.title;
          if (update.status) call.statuses.push(update.status);
          if (cfg.destroyWhenToolRuns && update.status === "in_progress" && !observed.destroyedWhileToolRan) {
            const destroying = (observed.destroyedWhileToolRan = { at_ms: elapsed() });
            sdk.destroySession(localId).then(
              () => (destroying.done = true),
              (err) => (destroying.error = describeError(err).message),
            );
          }
        }
      } catch (err) {
        observed.warnings.push(`session event listener failed: ${describeError(err).message}`);
      }
    });
    if (permission !== null) {
      sdk.onPermissionRequest(localId, (req) => {
        try {
          answerPermission(req);
        } catch (err) {
          observed.warnings.push(`permission listener failed: ${describeError(err).message}`);
          throw err;
        }
      });
      const answerPermission = (req) => {
        const seen = {
          id: req.id,
          at_ms: elapsed(),
          availableReplies: req.availableReplies,
          options: req.options.map((o) => ({ optionId: o.optionId, kind: o.kind, name: o.name })),
          toolCall: {
            toolCallId: req.toolCall?.toolCallId,
            title: req.toolCall?.title,
            kind: req.toolCall?.kind,
          },
          answer: permission,
          optionId: permission === "cancel" ? null : selectedOption(req, permission),
        };
        permissions.push(seen);
        const answering =
          permission === "cancel"
            ? sdk.rawRespondPermission(req.id, { outcome: { outcome: "cancelled" } })
            : sdk.respondPermission(req.id, permission);
        answering.then(
          () => (seen.answered = true),
          (err) => (seen.answerError = describeError(err).message),
        );
      };
    }
    const request = { id: localId, agent, cwd };
    for (const key of ["mode", "model", "thoughtLevel", "sessionInit"]) {
      if (cfg[key] !== undefined && cfg[key] !== null) request[key] = cfg[key];
    }
    session = await sdk.createSession(request);
    observed.sessionId = session.id;
    observed.session = {
      id: session.id,
      agentSessionId: session.agentSessionId,
      connectionId: session.lastConnectionId,
    };
    const sessionRecord = session.toRecord();
    if (sessionRecord.modes) observed.session.modes = sessionRecord.modes;
    if (sessionRecord.configOptions) {
      observed.session.configOptionIds = sessionRecord.configOptions.map((o) => o.id);
    }
  });

  await step("prompt", async () => {
    const response = await session.prompt([{ type: "text", text: promptText }]);
    observed.stopReason = response?.stopReason ?? null;
    if (response?.usage) observed.usage = response.usage;
  });
  if (steps.has("prompt")) {
    await settle(eventsSeen);
    observed.agentText = textChunks.join("");
  }

  await step("fs", async () => {
    const tag = randomUUID().slice(0, 8);
    const filePath = cfg.fsPath ?? path.posix.join(cwd, `sandbox-agent-flow-${tag}.txt`);
    const content = cfg.fsContent ?? `written through the sandbox-agent SDK ${tag}\n`;
    const fsResult = { path: filePath };
    observed.fs = fsResult;
    const written = await sub("fs:writeFsFile", sdk.writeFsFile({ path: filePath }, content));
    fsResult.write = written;
    const bytes = await sub("fs:readFsFile", sdk.readFsFile({ path: filePath }));
    fsResult.readBack = new TextDecoder().decode(bytes);
    fsResult.match = fsResult.readBack === content;
    const entries = await sub("fs:listFsEntries", sdk.listFsEntries({ path: path.posix.dirname(filePath) }));
    const listed = entries.find((e) => e.path === filePath || e.name === path.posix.basename(filePath));
    fsResult.listed = listed ?? null;
    fsResult.stat = await sub("fs:statFs", sdk.statFs({ path: filePath }));
    fsResult.deleted = await sub("fs:deleteFsEntry", sdk.deleteFsEntry({ path: filePath }));
  });

  await step("process", async () => {
    const run = await sdk.runProcess({
      command: cfg.processCommand ?? "echo",
      args: cfg.processArgs ?? ["hi"],
      cwd,
      timeoutMs: Math.min(10000, Math.max(1000, Math.floor(remaining()))),
    });
    observed.process = run;
    observed.processStdout = run.stdout;
  });

  await step("processLogs", async () => {
    const created = await sub(
      "processLogs:createProcess",
      sdk.createProcess({ command: "sh", args: ["-c", "echo out; echo err >&2"], cwd }),
    );
    let info = created;
    while (info.status !== "exited") {
      await new Promise((r) => setTimeout(r, 50));
      info = await sub("processLogs:getProcess", sdk.getProcess(created.id));
    }
    const logs = await sub("processLogs:getProcessLogs", sdk.getProcessLogs(created.id, { stream: "combined" }));
    observed.processLogs = {
      id: created.id,
      created,
      exited: info,
      stream: logs.stream,
      entries: logs.entries.map((e) => ({
        stream: e.stream,
        sequence: e.sequence,
        text: e.encoding === "base64" ? Buffer.from(e.data, "base64").toString("utf8") : e.data,
      })),
    };
  });

  await step("acpServers", async () => {
    const listed = await sdk.listAcpServers();
    observed.acpServers = listed.servers;
  });

  await step("destroySession", async () => {
    const destroyed = await sdk.destroySession(localId);
    observed.destroyed = { id: destroyed.id, destroyedAt: destroyed.destroyedAt ?? null };
  });
  if (steps.has("destroySession")) await settle(eventsSeen);

  await step("dispose", async () => {
    await sdk.dispose();
  });

  if (steps.has("createSession")) {
    observed.eventCount = eventCount;
    observed.eventMethods = events.map((e) => e.method ?? e.response);
    observed.sessionUpdates = events.filter((e) => e.sessionUpdate).map((e) => e.sessionUpdate);
    observed.permissions = permissions;
    observed.toolCalls = toolCalls;
  }
  observed.ok = true;
  observed.elapsedMs = elapsed();
  emit(observed, 0);
}

main().catch((err) => fail(err));
