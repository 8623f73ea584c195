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

Its other arguments: the directory with the `acorn` and `sucrase` packages (empty: none), and `typescript`
for a TypeScript context, whose code is stripped of its types by sucrase first (no type checking, as with
Deno's kernel on E2B).

Code runs with `vm.runInThisContext`, so globals and top-level `let`/`const`/`class` persist across
executions, like Node's REPL, and `require` resolves from the context's working directory. A returned
promise is awaited. Code that is not a script (top-level `await`, `import` declarations) or that calls
`import()` is rewritten with acorn, as Node's REPL does for `await`: its top-level declarations are
declared in the global scope (so they persist) and assigned inside an async function, which returns the
value of the last expression statement; `import x from "m"` becomes an assignment from `await import("m")`,
and every `import()` resolves bare names from the context's working directory (node_modules there, then
up), relative ones from it, builtins as themselves. Without acorn, such code is run inside an async
function: its declarations stay local and no value comes back. SIGINT interrupts synchronous code
(`breakOnSigint`) and abandons the promise being awaited.
"""

from __future__ import annotations

__all__ = ("DRIVER",)

DRIVER = r"""
'use strict';
const net = require('net');
const util = require('util');
const vm = require('vm');
const fs = require('fs');
const { builtinModules, createRequire } = require('module');
const path = require('path');
const { pathToFileURL } = require('url');

const [fd, tools, dialect] = process.argv.splice(2, 3);
const channel = new net.Socket({ fd: Number(fd), readable: true, writable: true });
const tool = (name) => (tools ? require(path.join(tools, name)) : null);
const acorn = tool('acorn');
const sucrase = dialect === 'typescript' ? tool('sucrase') : null;
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

// The entry of an ES-module-only package (no "require" export, so require.resolve fails) in node_modules of
// the working directory or above: its "exports" for the subpath (conditions import, node, default), else
// "module", "main", index.js.
function esmEntry(name) {
  const parts = name.split('/');
  const size = name.startsWith('@') ? 2 : 1;
  const [pkg, subpath] = [parts.slice(0, size).join('/'), ['.', ...parts.slice(size)].join('/')];
  for (let dir = process.cwd(); ; dir = path.dirname(dir)) {
    const root = path.join(dir, 'node_modules', pkg);
    if (fs.existsSync(path.join(root, 'package.json'))) {
      const manifest = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
      const pick = (target) => {
        if (typeof target === 'string' || target === null) return target;
        for (const condition of ['import', 'node', 'default']) {
          if (condition in target) return pick(target[condition]);
        }
        return null;
      };
      let exports = manifest.exports;
      if (typeof exports === 'string' || (exports && !Object.keys(exports).some((k) => k.startsWith('.')))) {
        exports = { '.': exports };
      }
      const entry = exports ? pick(exports[subpath] ?? null)
        : (subpath === '.' ? manifest.module || manifest.main || 'index.js' : subpath);
      return entry ? path.join(root, entry) : null;
    }
    if (dir === path.dirname(dir)) return null;
  }
}

const IMPORT = 'globalThis[Symbol.for("agent-sandbox.import")]';
Object.defineProperty(globalThis, Symbol.for('agent-sandbox.import'), {
  value: (specifier) => {
    // `npm:name@version/sub` (how code written for E2B's Deno kernel names packages) is `name/sub` here
    const name = String(specifier).replace(/^npm:(@[^/]+\/)?([^@/]+)(@[^/]*)?/, '$1$2');
    if (name.startsWith('node:') || builtinModules.includes(name)) return import(name);
    if (/^[./]/.test(name)) return import(pathToFileURL(path.resolve(name)).href);
    let file;
    try {
      file = globalThis.require.resolve(name);
    } catch {
      file = esmEntry(name);
    }
    if (file) return import(pathToFileURL(file).href);
    const error = new Error(`Cannot find package '${name}' in node_modules of ${process.cwd()} or above`);
    return Promise.reject(Object.assign(error, { code: 'ERR_MODULE_NOT_FOUND' }));
  },
});

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

function names(pattern, into) {
  switch (pattern.type) {
    case 'Identifier': into.push(pattern.name); break;
    case 'ObjectPattern':
      for (const p of pattern.properties) names(p.type === 'RestElement' ? p : p.value, into);
      break;
    case 'ArrayPattern': for (const p of pattern.elements) if (p) names(p, into); break;
    case 'AssignmentPattern': names(pattern.left, into); break;
    case 'RestElement': names(pattern.argument, into); break;
  }
  return into;
}

function dynamicImports(node, found) {
  if (node === null || typeof node !== 'object') return found;
  if (node.type === 'ImportExpression') found.push(node);
  for (const value of Object.values(node)) {
    if (Array.isArray(value)) for (const item of value) dynamicImports(item, found);
    else if (value && typeof value.type === 'string') dynamicImports(value, found);
  }
  return found;
}

// One top-level statement as the async function's body has it; `declare` takes the names it declares.
function statement(node, code, declare, last) {
  const text = (n) => code.slice(n.start, n.end);
  switch (node.type) {
    case 'ImportDeclaration': {
      const load = `(await ${IMPORT}(${JSON.stringify(node.source.value)}))`;
      const parts = [];
      for (const s of node.specifiers) {
        declare(s.local.name);
        if (s.type === 'ImportNamespaceSpecifier') parts.push(`${s.local.name} = __m`);
        else {
          const imported = s.type === 'ImportDefaultSpecifier' ? 'default' : (s.imported.name ?? s.imported.value);
          parts.push(`${s.local.name} = __m[${JSON.stringify(imported)}]`);
        }
      }
      return `await ((__m) => { ${parts.join('; ')} })${load};`;
    }
    case 'VariableDeclaration': {
      const assignments = [];
      for (const d of node.declarations) {
        names(d.id, []).forEach(declare);
        if (d.init || node.kind !== 'var') assignments.push(`(${text(d.id)} = ${d.init ? text(d.init) : 'undefined'})`);
      }
      return assignments.length ? `void (${assignments.join(', ')});` : '';
    }
    case 'ClassDeclaration':
      declare(node.id.name);
      return `${node.id.name} = ${text(node)};`;
    case 'ExportNamedDeclaration':
    case 'ExportDefaultDeclaration':
      return node.declaration ? statement(node.declaration, code, declare, last) : '';
    case 'ExpressionStatement':
      return last ? `return (${text(node.expression)});` : text(node);
    default:  // a function declaration stays, hoisted in the async function, and is published at its start
      return text(node);
  }
}

const PUBLISH = Symbol.for('agent-sandbox.publish');
const PUBLISHED = 'globalThis[Symbol.for("agent-sandbox.publish")]';
Object.defineProperty(globalThis, PUBLISH, {
  value: (name, value) => {  // assigns the global binding `name`, which a local of the same name hides
    globalThis[PUBLISH].value = value;
    vm.runInThisContext(`${name} = ${PUBLISHED}.value;`);
    delete globalThis[PUBLISH].value;
  },
});

const lines = (text) => text.split('\n').length - 1;

// Code as an async function whose top-level declarations live in the global scope (see the docstring). Each
// statement is replaced where it is, keeping its line count, so that stack traces name the user's lines.
function rewrite(code) {
  const program = acorn.parse(code, { ecmaVersion: 'latest', sourceType: 'module', allowAwaitOutsideFunction: true });
  const imports = dynamicImports(program, []);
  if (imports.length) {
    let source = code;
    for (const node of imports.sort((a, b) => b.start - a.start)) {
      const specifier = code.slice(node.source.start, node.source.end);
      source = `${source.slice(0, node.start)}${IMPORT}(${specifier})${source.slice(node.end)}`;
    }
    return rewrite(source);
  }
  const declared = new Set();
  const functions = [];
  let source = code;
  for (let index = program.body.length - 1; index >= 0; index -= 1) {
    const node = program.body[index];
    const declaration = node.type.startsWith('Export') && node.declaration ? node.declaration : node;
    if (declaration.type === 'FunctionDeclaration') {
      declared.add(declaration.id.name);
      functions.push(declaration.id.name);
    }
    const original = code.slice(node.start, node.end);
    let text = statement(node, code, (name) => declared.add(name), index === program.body.length - 1);
    text += '\n'.repeat(Math.max(0, lines(original) - lines(text)));
    source = `${source.slice(0, node.start)}${text}${source.slice(node.end)}`;
  }
  for (const name of declared) {
    try {
      vm.runInThisContext(`let ${name};`);
    } catch (error) {
      if (!(error instanceof SyntaxError)) throw error;  // declared by an earlier execution: assigned again
    }
  }
  const publish = functions.map((name) => `${PUBLISHED}(${JSON.stringify(name)}, ${name});`);
  return `(async () => { ${publish.join(' ')}${source}\n})()`;
}

function compile(code, filename) {
  const script = (source, lineOffset = 0) => new vm.Script(source, { filename, lineOffset });
  const js = sucrase ? sucrase.transform(code, { transforms: ['typescript'], disableESTransforms: true }).code : code;
  if (acorn && /\bimport\b/.test(js)) return script(rewrite(js));
  try {
    return script(js);
  } catch (error) {
    if (!(error instanceof SyntaxError)) throw error;
    if (acorn) return script(rewrite(js));
    if (!/await/.test(error.message)) throw error;
    return script(`(async () => {\n${js}\n})()`, -1);
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
