"""The JavaScript side of a JavaScript context: the script each context's Node.js process runs.

It is kept as a Python string so that it travels with the executor package (the image builder copies and
hashes `*.py`); the service writes it to its runtime directory at start-up. The process reads requests
`{"code", "env"}` as JSON lines on the socket whose fd is its first argument, and answers on the same
socket with JSON lines:

    {"type": "count", "count": n}             the execution started (its number)
    {"type": "stdout"|"stderr", "text": s}    what the code wrote with console.* or process.stdout/stderr
    {"type": "result", "text": s}             util.inspect of the value of the last expression (not undefined)
    {"type": "error", "name", "value", "traceback"}
    {"type": "done"}                          the execution is over

Code runs with `vm.runInThisContext`, so globals and top-level `let`/`const`/`class` persist across
executions, like Node's REPL, and `require` resolves from the context's working directory. A returned
promise is awaited. Code using top-level `await` is retried inside
an async function: it runs, but its declarations stay local and no value comes back. SIGINT interrupts
synchronous code (`breakOnSigint`) and abandons the promise being awaited.
"""

from __future__ import annotations

__all__ = ("DRIVER",)

DRIVER = r"""
'use strict';
const net = require('net');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');
const path = require('path');

const channel = new net.Socket({ fd: Number(process.argv.splice(2, 1)[0]), readable: true, writable: true });
const send = (message) => channel.write(JSON.stringify(message) + '\n');

for (const name of ['stdout', 'stderr']) {
  process[name].write = (chunk, encoding, callback) => {
    send({ type: name, text: typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8') });
    const done = typeof encoding === 'function' ? encoding : callback;
    if (typeof done === 'function') process.nextTick(done);
    return true;
  };
}
globalThis.require = createRequire(path.join(process.cwd(), '[context]'));

let count = 0;
let interrupt = null;
process.on('SIGINT', () => { if (interrupt) interrupt(); });
const warn = (text) => send({ type: 'stderr', text: `${text}\n` });
process.on('uncaughtException', (error) => warn(`Uncaught ${util.inspect(error)}`));
process.on('unhandledRejection', (reason) => warn(`Unhandled rejection: ${util.inspect(reason)}`));

const nodeFrame = /node:vm:|node:internal\/process\/task_queues/;
const driverFrame = (line) => line.includes(__filename) || nodeFrame.test(line);

function errorLine(error) {
  if (error !== null && typeof error === 'object' && 'message' in error) {
    const interrupted = error.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED';
    const name = interrupted ? 'KeyboardInterrupt' : String(error.name || 'Error');
    const stack = String(error.stack || `${name}: ${error.message}`).split('\n');
    const traceback = stack.filter((line) => !driverFrame(line)).join('\n');
    return { type: 'error', name, value: String(error.message), traceback };
  }
  return { type: 'error', name: 'Error', value: util.inspect(error), traceback: `Uncaught ${util.inspect(error)}` };
}

function compile(code, filename) {
  try {
    return new vm.Script(code, { filename });
  } catch (error) {
    if (!(error instanceof SyntaxError) || !/await/.test(error.message)) throw error;
    return new vm.Script(`(async () => {\n${code}\n})()`, { filename, lineOffset: -1 });
  }
}

function interrupted() {
  return new Promise((resolve, reject) => {
    interrupt = () => reject(Object.assign(new Error('Execution interrupted'), { name: 'KeyboardInterrupt' }));
  });
}

function setEnv(env) {
  const saved = {};
  for (const [key, value] of Object.entries(env)) {
    saved[key] = process.env[key];
    process.env[key] = value;
  }
  return () => {
    for (const [key, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
  };
}

async function execute(request) {
  count += 1;
  send({ type: 'count', count });
  const restoreEnv = setEnv(request.env || {});
  try {
    const script = compile(request.code, `<cell ${count}>`);
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      value = await Promise.race([value, interrupted()]);
    }
    if (value !== undefined) send({ type: 'result', text: util.inspect(value) });
  } catch (error) {
    send(errorLine(error));
  } finally {
    interrupt = null;
    restoreEnv();
    send({ type: 'done' });
  }
}

let pending = '';
let queue = Promise.resolve();
channel.setEncoding('utf8');
channel.on('data', (data) => {
  pending += data;
  for (let end = pending.indexOf('\n'); end >= 0; end = pending.indexOf('\n')) {
    const line = pending.slice(0, end);
    pending = pending.slice(end + 1);
    if (line) queue = queue.then(() => execute(JSON.parse(line)));
  }
});
channel.on('end', () => process.exit(0));
"""
