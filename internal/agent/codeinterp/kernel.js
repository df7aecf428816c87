'use strict';
// JavaScript and TypeScript kernel of the cellfork code interpreter: one
// node process per code context, started and driven by the Go package
// internal/agent/codeinterp (see foreign.go there for the protocol: framed
// commands on fd 3, JSON events on fd 4, user output on fd 1 and 2 ended by
// a marker after each cell). `node kernel.js typescript` strips TypeScript
// types first (node-typescript).
//
// A cell runs in node's main context, so it has every node global (process,
// require, Buffer, fetch, timers). To keep state between cells and allow
// top-level await and ES imports, each cell is rewritten (acorn) into an
// async function whose top-level declarations become globals:
//   const x = 1; import {a} from 'm'; x + a
// runs as
//   var x, a; (async () => { void (x = 1); ({a} = await __cellfork_import('m')); return (x + a); })()
// so `const` and `let` may be declared again in a later cell, as in a REPL.

const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');
const { pathToFileURL } = require('url');
const acorn = require('acorn');
const walk = require('acorn-walk');

const CMD_FD = 3;
const EVT_FD = 4;
const typescript = process.argv[2] === 'typescript' ? require('typescript') : null;
const mark = process.env.CELLFORK_MARK || '';
delete process.env.CELLFORK_MARK;

let count = 0; // execution_count
let running = null; // {interrupt(err)} while a cell awaits

function send(event) {
  writeAll(EVT_FD, Buffer.from(JSON.stringify(event) + '\n'));
}

function writeAll(fd, buf) {
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(fd, buf, off);
    } catch (err) {
      if (err.code === 'EAGAIN') continue;
      if (fd === EVT_FD) process.exit(0); // the agent is gone
      throw err;
    }
  }
}

// ---- cells -----------------------------------------------------------------

const parseOptions = {
  ecmaVersion: 'latest',
  allowAwaitOutsideFunction: true,
  allowReturnOutsideFunction: true,
  allowHashBang: true,
};

function parse(code) {
  try {
    return acorn.parse(code, { ...parseOptions, sourceType: 'module' });
  } catch (moduleErr) {
    // Sloppy-mode code (with, octal literals) is no module.
    try {
      return acorn.parse(code, { ...parseOptions, sourceType: 'script' });
    } catch (_) {
      const err = new SyntaxError(moduleErr.message);
      err.stack = `SyntaxError: ${moduleErr.message}\n    at <cell>:${moduleErr.loc ? moduleErr.loc.line : 1}`;
      throw err;
    }
  }
}

// patternNames lists the identifiers a declaration pattern binds.
function patternNames(node, out) {
  switch (node.type) {
    case 'Identifier': out.push(node.name); break;
    case 'ObjectPattern':
      for (const p of node.properties) patternNames(p.type === 'RestElement' ? p.argument : p.value, out);
      break;
    case 'ArrayPattern':
      for (const e of node.elements) if (e) patternNames(e, out);
      break;
    case 'RestElement': patternNames(node.argument, out); break;
    case 'AssignmentPattern': patternNames(node.left, out); break;
  }
  return out;
}

// dynamicImports turns import() into the kernel's import, which resolves
// from the working directory (node's vm module offers import() to scripts
// only behind --experimental-vm-modules).
function dynamicImports(code, ast) {
  const at = [];
  walk.simple(ast, { ImportExpression(node) { at.push(node.start); } });
  for (const start of at.sort((a, b) => b - a)) {
    code = code.slice(0, start) + '__cellfork_import' + code.slice(start + 'import'.length);
  }
  return at.length ? code : null;
}

// rewrite turns a cell into a script whose value is a promise of the cell's
// last expression (see the top of this file).
function rewrite(code) {
  let ast = parse(code);
  const imported = dynamicImports(code, ast);
  if (imported !== null) {
    code = imported;
    ast = parse(code);
  }
  const src = (n) => code.slice(n.start, n.end);
  const names = new Set();
  const edits = []; // {start, end, text}, in order
  const hoisted = []; // function declarations, run first
  if (code.startsWith('#!')) edits.push({ start: 0, end: code.indexOf('\n') < 0 ? code.length : code.indexOf('\n'), text: '' });

  const declare = (node, decl) => {
    switch (decl.type) {
      case 'VariableDeclaration': {
        const parts = [];
        for (const d of decl.declarations) {
          patternNames(d.id, []).forEach((n) => names.add(n));
          if (d.init) parts.push(`${src(d.id)} = (${src(d.init)})`);
        }
        edits.push({ start: node.start, end: node.end, text: parts.length ? `void (${parts.join(', ')});` : '' });
        return;
      }
      case 'FunctionDeclaration':
        names.add(decl.id.name);
        hoisted.push(`${decl.id.name} = ${src(decl)};`);
        edits.push({ start: node.start, end: node.end, text: '' });
        return;
      case 'ClassDeclaration':
        names.add(decl.id.name);
        edits.push({ start: node.start, end: node.end, text: `${decl.id.name} = ${src(decl)};` });
        return;
    }
  };

  ast.body.forEach((node, i) => {
    const last = i === ast.body.length - 1;
    switch (node.type) {
      case 'VariableDeclaration':
      case 'FunctionDeclaration':
      case 'ClassDeclaration':
        declare(node, node);
        break;
      case 'ImportDeclaration': {
        const from = JSON.stringify(node.source.value);
        const props = [];
        let ns = null;
        for (const s of node.specifiers) {
          names.add(s.local.name);
          if (s.type === 'ImportNamespaceSpecifier') ns = s.local.name;
          else if (s.type === 'ImportDefaultSpecifier') props.push(`default: ${s.local.name}`);
          else props.push(`${s.imported.type === 'Literal' ? JSON.stringify(s.imported.value) : s.imported.name}: ${s.local.name}`);
        }
        let text = `await __cellfork_import(${from})`;
        if (ns) text = `${ns} = ${text}`;
        if (props.length) text = `({${props.join(', ')}} = ${ns ? ns : text})`;
        if (ns && props.length) text = `${ns} = await __cellfork_import(${from}); ${text}`;
        edits.push({ start: node.start, end: node.end, text: text + ';' });
        break;
      }
      case 'ExportNamedDeclaration':
        if (node.declaration) declare(node, node.declaration);
        else edits.push({ start: node.start, end: node.end, text: '' });
        break;
      case 'ExportDefaultDeclaration': {
        const d = node.declaration;
        if ((d.type === 'FunctionDeclaration' || d.type === 'ClassDeclaration') && d.id) declare(node, d);
        else edits.push({ start: node.start, end: node.end, text: last ? `return (${src(d)});` : `${src(d)};` });
        break;
      }
      case 'ExportAllDeclaration':
        edits.push({ start: node.start, end: node.end, text: '' });
        break;
      case 'ExpressionStatement':
        if (last && !node.directive) edits.push({ start: node.start, end: node.end, text: `return (${src(node.expression)});` });
        break;
    }
  });

  let body = '';
  let pos = 0;
  for (const e of edits.sort((a, b) => a.start - b.start)) {
    body += code.slice(pos, e.start) + e.text;
    pos = e.end;
  }
  body += code.slice(pos);
  // All on the first line, so line numbers in errors are the cell's.
  const vars = names.size ? `var ${[...names].join(', ')}; ` : '';
  return `${vars}(async () => { ${hoisted.join(' ')}${body}\n})()`;
}

// importModule serves `import` statements and import(): require() first (relative to the
// working directory, like node's REPL), then a real import() for ES modules.
async function importModule(spec) {
  const req = createRequire(path.join(process.cwd(), '[cellfork]'));
  try {
    const mod = req(spec);
    if (mod !== null && (typeof mod === 'object' || typeof mod === 'function')) {
      return mod.__esModule ? mod : Object.assign(Object.create(null), mod, { default: mod });
    }
    return { default: mod };
  } catch (err) {
    if (err.code !== 'ERR_REQUIRE_ESM') throw err;
    return import(pathToFileURL(req.resolve(spec)).href);
  }
}

function setupGlobals() {
  const req = createRequire(path.join(process.cwd(), '[cellfork]'));
  Object.defineProperty(globalThis, '__cellfork_import', { value: importModule });
  globalThis.require = req;
  globalThis.module = { exports: {}, require: req, id: '[cellfork]', filename: null, loaded: false, children: [], paths: [] };
  globalThis.exports = globalThis.module.exports;
  globalThis.__filename = path.join(process.cwd(), '[cellfork]');
  globalThis.__dirname = process.cwd();
  // A rejected promise or a throw in a callback nobody waits for is reported,
  // not fatal to the kernel.
  process.on('unhandledRejection', (reason) => {
    process.stderr.write(`Unhandled promise rejection: ${util.inspect(reason)}\n`);
  });
  process.on('uncaughtException', (err) => {
    process.stderr.write(`Uncaught exception: ${err && err.stack ? err.stack : util.inspect(err)}\n`);
  });
  process.on('SIGINT', () => {
    if (running) running.interrupt();
  });
}

function interruptedError() {
  const err = new Error('Script execution interrupted.');
  err.code = 'ERR_SCRIPT_EXECUTION_INTERRUPTED';
  return err;
}

// text is the text/plain form of a value; as upstream, a string shows
// without its quotes.
function text(value) {
  let s = util.inspect(value, { depth: 4, maxArrayLength: 1000, maxStringLength: 1 << 20 });
  if (s.length >= 2 && ((s[0] === "'" && s.endsWith("'")) || (s[0] === '"' && s.endsWith('"')))) s = s.slice(1, -1);
  return s;
}

// stack leaves out the frames of this kernel and of node's vm module,
// which every cell runs under.
function stack(err) {
  const lines = String(err.stack || '').split('\n');
  const own = lines.findIndex((l) => /^\s+at /.test(l) && (l.includes(__filename) || l.includes('node:vm')));
  return (own < 0 ? lines : lines.slice(0, own)).join('\n');
}

function errorEvent(err) {
  if (err instanceof Error || (err && typeof err === 'object' && 'message' in err)) {
    return { type: 'error', name: String(err.name || 'Error'), value: String(err.message), traceback: stack(err) };
  }
  return { type: 'error', name: 'Error', value: util.inspect(err), traceback: '' };
}

async function runCell(code) {
  let script = typescript ? transpile(code) : code;
  script = rewrite(script);
  const promise = vm.runInThisContext(script, {
    filename: `<cell-${count}>`,
    breakOnSigint: true,
  });
  let interrupt;
  const stop = new Promise((_, reject) => { interrupt = () => reject(interruptedError()); });
  running = { interrupt };
  try {
    return await Promise.race([promise, stop]);
  } finally {
    running = null;
  }
}

function transpile(code) {
  const out = typescript.transpileModule(code, {
    compilerOptions: {
      target: typescript.ScriptTarget.ES2022,
      module: typescript.ModuleKind.ESNext,
      esModuleInterop: true,
    },
    reportDiagnostics: false,
  });
  return out.outputText.replace(/^export \{\};\s*$/m, '');
}

// ---- environment -----------------------------------------------------------

function setEnv(vars) {
  for (const [k, v] of vars) process.env[k] = v;
}

// pushEnv sets an execution's own variables and returns how to undo it.
function pushEnv(vars) {
  const saved = vars.map(([k]) => [k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined]);
  setEnv(vars);
  return () => {
    for (const [k, v] of saved) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
}

async function execute(cmd) {
  count++;
  send({ type: 'number_of_executions', execution_count: count });
  setEnv(cmd.env);
  const pop = pushEnv(cmd.tmpEnv);
  try {
    const value = await runCell(cmd.code);
    if (value !== undefined) send({ type: 'result', text: text(value), is_main_result: true });
  } catch (err) {
    send(errorEvent(err));
  } finally {
    pop();
    writeAll(1, Buffer.from(mark));
    writeAll(2, Buffer.from(mark));
    send({ type: 'done', id: cmd.id });
  }
}

// ---- commands --------------------------------------------------------------

// Commands reader: "<id> <nenv> <ntmp>\n" then 1 + 2*nenv + 2*ntmp fields,
// each "<byte length>\n<bytes>".
function commands(onCommand) {
  let buf = Buffer.alloc(0);
  let queue = Promise.resolve();
  // A socket on the pipe, read by the event loop: a file stream would park
  // a libuv pool thread in read(), and process.exit() waits for the pool.
  const stream = new net.Socket({ fd: CMD_FD, readable: true, writable: false });
  const line = (from) => {
    const nl = buf.indexOf(10, from);
    return nl < 0 ? null : [buf.toString('latin1', from, nl), nl + 1];
  };
  const tryParse = () => {
    const head = line(0);
    if (!head) return null;
    const [id, nenv, ntmp] = head[0].split(' ').map(Number);
    let pos = head[1];
    const fields = [];
    for (let i = 0; i < 1 + 2 * (nenv + ntmp); i++) {
      const l = line(pos);
      if (!l) return null;
      const len = Number(l[0]);
      if (buf.length < l[1] + len) return null;
      fields.push(buf.toString('utf8', l[1], l[1] + len));
      pos = l[1] + len;
    }
    buf = buf.subarray(pos);
    const pairs = (from, n) => Array.from({ length: n }, (_, i) => [fields[from + 2 * i], fields[from + 2 * i + 1]]);
    return { id, code: fields[0], env: pairs(1, nenv), tmpEnv: pairs(1 + 2 * nenv, ntmp) };
  };
  stream.on('data', (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    for (let cmd = tryParse(); cmd; cmd = tryParse()) {
      const c = cmd;
      queue = queue.then(() => onCommand(c));
    }
  });
  stream.on('end', () => queue.then(() => process.exit(0)));
  stream.on('error', () => process.exit(0));
}

setupGlobals();
if (typescript) transpile('const warm: number = 1'); // load it before "ready"
commands(execute);
send({ type: 'ready', pid: process.pid });
