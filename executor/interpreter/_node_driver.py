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
promise is awaited. Code that is a script runs as one (its `import()` calls routed to the importer); code
that is not (top-level `await`, `import` declarations) is rewritten with acorn, as Node's REPL does for
`await`: its top-level declarations (and nested `var`s) are declared in the global scope once it compiled,
so they persist, and assigned inside an async function, which returns the value of the last expression
statement; `import x from "m"` becomes an assignment from `await import("m")`. Every import resolves bare
names from the context's working directory (node_modules there, then up), relative ones from it, builtins
as themselves. Without acorn, such code is run inside an async function: its declarations stay local and
no value comes back. SIGINT interrupts synchronous code (`breakOnSigint`) and abandons the promise being
awaited.
"""

from __future__ import annotations

__all__ = ("DRIVER",)

DRIVER = r"""
'use strict';
// The driver's own names of the builtins: a cell's global `const JSON = ...` or `class Error {}` shadows
// the global ones for every script, but never these parameters.
((JSON, process, Promise, Object, Symbol, Error, SyntaxError, Array, Map, Set, String, Number, Buffer, Math) => {
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
  value: (specifier, options) => {
    // `npm:name@version/sub` (how code written for E2B's Deno kernel names packages) is `name/sub` here
    const name = String(specifier).replace(/^npm:(@[^/]+\/)?([^@/]+)(@[^/]*)?/, '$1$2');
    if (name.startsWith('node:') || builtinModules.includes(name)) return import(name);
    if (/^[./]/.test(name)) return import(pathToFileURL(path.resolve(name)).href, options);
    let file;
    try {
      file = globalThis.require.resolve(name);
    } catch {
      file = esmEntry(name);
    }
    if (file) return import(pathToFileURL(file).href, options);
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

// The script goal (sloppy code stays sloppy), with `await` and `import` declarations allowed at the top.
const PARSE = {
  ecmaVersion: 'latest', sourceType: 'script', allowAwaitOutsideFunction: true, allowImportExportEverywhere: true,
};
const FUNCTIONS = new Set(['FunctionDeclaration', 'FunctionExpression', 'ArrowFunctionExpression']);

function dynamicImports(node, found) {
  if (node === null || typeof node !== 'object') return found;
  if (node.type === 'ImportExpression') found.push(node);
  for (const value of Object.values(node)) {
    if (Array.isArray(value)) for (const item of value) dynamicImports(item, found);
    else if (value && typeof value.type === 'string') dynamicImports(value, found);
  }
  return found;
}

// `code` with every `import(...)` calling the importer, which resolves from the context's cwd; or null.
function routeDynamicImports(code) {
  const found = dynamicImports(acorn.parse(code, PARSE), []).sort((a, b) => b.start - a.start);
  let source = code;
  for (const node of found) {
    const options = node.options ? `, ${code.slice(node.options.start, node.options.end)}` : '';
    const call = `${IMPORT}(${code.slice(node.source.start, node.source.end)}${options})`;
    source = `${source.slice(0, node.start)}${call}${source.slice(node.end)}`;
  }
  return found.length ? source : null;
}

const PUBLISH = Symbol.for('agent-sandbox.publish');
const PUBLISHED = 'globalThis[Symbol.for("agent-sandbox.publish")]';
Object.defineProperty(globalThis, PUBLISH, {
  value: (name, fn) => {  // a function declared under another name: the global `name` is it, named `name`
    Object.defineProperty(fn, 'name', { value: name });
    globalThis[PUBLISH].value = fn;
    vm.runInThisContext(`${name} = ${PUBLISHED}.value;`);
    delete globalThis[PUBLISH].value;
  },
});

const lines = (text) => text.split('\n').length - 1;

// The edits that turn a cell into the body of an async function whose top-level declarations are the
// global scope's (Node's REPL does the same for `await`): [start, end, replacement] for `code`'s ranges,
// the names to declare globally with their kind, and the functions to publish.
class Rewrite {
  constructor(code) {
    this.code = code;
    this.edits = [];
    this.declared = new Map();
    this.functions = [];
  }

  text(node) { return this.code.slice(node.start, node.end); }

  replace(node, text) { this.edits.push([node.start, node.end, text]); }

  declare(name, kind) { if (!this.declared.has(name) || kind === 'var') this.declared.set(name, kind); }

  assignments(declaration, kind) {
    const parts = [];
    for (const d of declaration.declarations) {
      names(d.id, []).forEach((name) => this.declare(name, kind));
      if (d.init || kind !== 'var') parts.push(`(${this.text(d.id)} = ${d.init ? this.text(d.init) : 'undefined'})`);
    }
    return parts;
  }

  topLevel(node, last) {
    switch (node.type) {
      case 'ImportDeclaration': {
        const attributes = (node.attributes || []).map((a) => `${this.text(a.key)}: ${this.text(a.value)}`);
        const options = attributes.length ? `, { with: { ${attributes.join(', ')} } }` : '';
        const load = `(await ${IMPORT}(${JSON.stringify(node.source.value)}${options}))`;
        const parts = node.specifiers.map((s) => {
          this.declare(s.local.name, 'let');
          if (s.type === 'ImportNamespaceSpecifier') return `${s.local.name} = __m`;
          const imported = s.type === 'ImportDefaultSpecifier' ? 'default' : (s.imported.name ?? s.imported.value);
          return `${s.local.name} = __m[${JSON.stringify(imported)}]`;
        });
        return this.replace(node, `await ((__m) => { ${parts.join('; ')} })${load};`);
      }
      case 'VariableDeclaration': {
        const parts = this.assignments(node, node.kind === 'var' ? 'var' : 'let');
        return this.replace(node, parts.length ? `void (${parts.join(', ')});` : '');
      }
      case 'FunctionDeclaration': {  // stays a declaration (hoisted) under another name; published first
        const local = `${node.id.name}$agentSandboxFunction`;
        this.declare(node.id.name, 'var');
        this.functions.push([node.id.name, local]);
        return this.replace(node.id, local);
      }
      case 'ClassDeclaration':
        this.declare(node.id.name, 'let');
        return this.replace(node, `${node.id.name} = ${this.text(node)};`);
      case 'ExportAllDeclaration':
        return this.replace(node, '');
      case 'ExportNamedDeclaration':
      case 'ExportDefaultDeclaration': {  // nothing imports a cell: `export` is dropped
        const declaration = node.declaration;
        if (!declaration) return this.replace(node, '');
        if (declaration.type === 'VariableDeclaration' || (declaration.id && /Declaration$/.test(declaration.type))) {
          this.replace({ start: node.start, end: declaration.start }, '');
          return this.topLevel(declaration, last);
        }
        return this.replace(node, last ? `return (${this.text(declaration)});` : `(${this.text(declaration)});`);
      }
      case 'ExpressionStatement':
        return last ? this.replace(node, `return (${this.text(node.expression)});`) : this.nested(node);
      default:
        return this.nested(node);
    }
  }

  // `var` below the top level (in blocks, loops, try) belongs to the function scope: made global too.
  nested(node) {
    if (node === null || typeof node !== 'object' || FUNCTIONS.has(node.type) || /^Class/.test(node.type)) return;
    for (const [key, value] of Object.entries(node)) {
      for (const child of Array.isArray(value) ? value : [value]) {
        if (!child || typeof child.type !== 'string') continue;
        if (child.type === 'VariableDeclaration' && child.kind === 'var') {
          const parts = this.assignments(child, 'var');
          const head = (node.type === 'ForStatement' && key === 'init') || /^For(In|Of)Statement$/.test(node.type);
          const target = key === 'init' ? parts.join(', ') || 'void 0' : this.text(child.declarations[0].id);
          if (head) this.replace(child, target);
          else this.replace(child, parts.length ? `void (${parts.join(', ')});` : ';');
          child.declarations.forEach((d) => d.init && this.nested(d.init));
        } else {
          this.nested(child);
        }
      }
    }
  }

  source() {
    const pieces = [];
    let at = 0;
    for (const [start, end, text] of this.edits.sort((a, b) => a[0] - b[0])) {  // in order, joined once
      const padding = '\n'.repeat(Math.max(0, lines(this.code.slice(start, end)) - lines(text)));
      pieces.push(this.code.slice(at, start), text, padding);
      at = end;
    }
    pieces.push(this.code.slice(at));
    const source = pieces.join('');
    const publish = this.functions.map(([name, local]) => `${PUBLISHED}(${JSON.stringify(name)}, ${local});`);
    return `(async () => { ${publish.join(' ')}${source}\n})()`;
  }
}

// Declares the names a rewritten cell assigns, once it compiled: a global property (a `var`, a function,
// a builtin such as `fetch`) needs nothing, a global `let` of an earlier cell is assigned again.
function declareGlobally(declared) {
  for (const [name, kind] of declared) {
    const property = name in globalThis;
    if (property && kind === 'var') continue;  // a script's `var fetch = ...` sets the property too
    try {  // a `let` over a global property shadows it (as a script's `const fetch` does), starting as its value
      vm.runInThisContext(property ? `let ${name} = globalThis[${JSON.stringify(name)}];` : `${kind} ${name};`);
    } catch (error) {
      if (!(error instanceof SyntaxError)) throw error;
    }
  }
}

function rewritten(code, filename) {
  const routed = routeDynamicImports(code);
  const program = acorn.parse(routed ?? code, PARSE);
  const rewrite = new Rewrite(routed ?? code);
  program.body.forEach((node, index) => rewrite.topLevel(node, index === program.body.length - 1));
  const script = new vm.Script(rewrite.source(), { filename });
  return { script, declare: () => declareGlobally(rewrite.declared) };
}

// The cell as a script to run, and what declares its names first. Code that is a script runs as it is
// (its `import()` calls routed to the importer); code that is not is rewritten (see the docstring).
function compile(code, filename) {
  const js = sucrase
    ? sucrase.transform(code, { transforms: ['typescript'], disableESTransforms: true, keepUnusedImports: true }).code
    : code;
  const none = () => {};
  try {
    const script = new vm.Script(js, { filename });
    const routed = acorn && /\bimport\s*\(/.test(js) ? routeDynamicImports(js) : null;
    return { script: routed ? new vm.Script(routed, { filename }) : script, declare: none };
  } catch (error) {
    if (!(error instanceof SyntaxError)) throw error;
    if (acorn) {
      try {
        return rewritten(js, filename);
      } catch (rewriteError) {  // acorn's own SyntaxError (it has `raisedAt`): V8's says it better
        throw rewriteError instanceof SyntaxError && 'raisedAt' in rewriteError ? error : rewriteError;
      }
    }
    if (!/await/.test(error.message)) throw error;
    return { script: new vm.Script(`(async () => {\n${js}\n})()`, { filename, lineOffset: -1 }), declare: none };
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

function safeErrorLine(error) {
  try {
    return errorLine(error);
  } catch {  // an error whose message or stack throws (a getter, a revoked Proxy)
    return { type: 'error', name: 'Error', value: '<an error that cannot be printed>', traceback: '' };
  }
}

async function execute(request) {
  count += 1;
  send({ type: 'count', count });
  let restoreEnv = () => {};
  try {
    restoreEnv = setEnv(request.env || {});
    const { script, declare } = compile(request.code, `<cell ${count}>`);
    declare();
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      value = await Promise.race([value, interrupted()]);
    }
    if (value !== undefined) send({ type: 'result', text: util.inspect(value) });
  } catch (error) {
    send(safeErrorLine(error));
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
    if (line) queue = queue.then(() => execute(JSON.parse(line))).catch(() => {});  // one failure never stops the queue
  }
});
channel.on('end', () => process.exit(0));
})(JSON, process, Promise, Object, Symbol, Error, SyntaxError, Array, Map, Set, String, Number, Buffer, Math);
"""
