// The code interpreter's six languages through the official
// @e2b/code-interpreter package: each language's contexts keep state,
// stream stdout and stderr as they are written, report errors in E2B's
// shapes, see the sandbox's and the execution's environment variables and
// their working directory, and are interrupted by a timeout without
// losing their state; plus the refusals (an unknown language, a cwd that
// does not exist or that the kernels' user cannot enter), /execute's
// headers sent at once, and a kill during silent code. One sandbox serves
// the file. (A kernel that dies, and restarts, are the Python suite's:
// tests/conformance/test_code_interpreter*.py.)
import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'

import { InvalidArgumentError, Sandbox, SandboxError, TimeoutError } from '@e2b/code-interpreter'

import { api, env, sandbox } from './helpers.mjs'

const T = { timeout: 120_000 }
const SANDBOX_ENVS = { CF_LANG_ENV: 'sandbox-level' }
let ci
let token // the sandbox's envd access token, for requests the SDK does not make

before(async () => {
  ci = await sandbox({ envs: SANDBOX_ENVS, timeoutMs: 600_000 }, undefined, Sandbox)
  token = (await api('GET', `/sandboxes/${ci.sandboxId}`)).body.envdAccessToken
})

// Per language: code that sets x to 40, code whose value is x + 2 and how
// it shows; code printing "hello" and "oops" (stderr); code that fails,
// with the error's name and value; code showing FOO, the sandbox's
// CF_LANG_ENV and the working directory; code that runs forever; and code
// that prints twice two seconds apart.
const LANGS = {
  python: {
    set: 'x = 40', get: 'x + 2', value: '42',
    print: "print('hello')", fail: '1 / 0', error: ['ZeroDivisionError', 'division by zero'],
    env: "import os; os.environ.get('FOO', 'unset')", sandboxEnv: "import os; os.environ['CF_LANG_ENV']",
    cwd: 'import os; os.getcwd()', forever: 'while True: pass',
    eprint: "import sys; print('oops', file=sys.stderr)",
    live: "import time; print('a', flush=True); time.sleep(2); print('b')",
  },
  javascript: {
    set: 'let x = 40', get: 'x + 2', value: '42',
    print: "console.log('hello')", fail: 'null.x', error: ['TypeError', "Cannot read properties of null (reading 'x')"],
    env: "process.env.FOO || 'unset'", sandboxEnv: 'process.env.CF_LANG_ENV',
    cwd: 'process.cwd()', forever: 'while (true) {}',
    eprint: "console.error('oops')",
    live: "console.log('a'); await new Promise(r => setTimeout(r, 2000)); console.log('b')",
  },
  typescript: {
    set: 'const x: number = 40', get: 'x + 2', value: '42',
    print: "const s: string = 'hello'; console.log(s)", fail: "throw new RangeError('out')", error: ['RangeError', 'out'],
    env: "process.env.FOO || 'unset'", sandboxEnv: 'process.env.CF_LANG_ENV',
    cwd: 'process.cwd()', forever: 'while (true) {}',
    eprint: "console.error('oops')", live: null,
  },
  r: {
    set: 'x <- 40', get: 'x + 2', value: '[1] 42',
    print: 'cat("hello\\n")', fail: 'stop("bad")', error: ['ERROR', 'Error: bad\n'],
    env: 'Sys.getenv("FOO", unset = "unset")', sandboxEnv: 'Sys.getenv("CF_LANG_ENV")',
    cwd: 'getwd()', forever: 'while (TRUE) {}',
    // As IRkernel: an expression's output is sent when it ends.
    eprint: 'message("oops")', live: 'cat("a\\n")\nSys.sleep(2)\ncat("b\\n")',
  },
  java: {
    set: 'int x = 40;', get: 'x + 2', value: '42',
    print: 'System.out.println("hello");', fail: 'int y = 1 / 0;', error: ['java.lang.ArithmeticException', '/ by zero'],
    env: 'System.getProperty("FOO", "unset")', sandboxEnv: 'System.getProperty("CF_LANG_ENV")',
    cwd: 'System.getProperty("user.dir")', forever: 'while (true) {}',
    eprint: 'System.err.println("oops");',
    live: 'System.out.println("a"); Thread.sleep(2000); System.out.println("b");',
  },
  bash: {
    set: 'x=40', get: 'echo $((x + 2))', value: null, // bash has no values: its output is stdout
    print: 'echo hello', fail: 'false', error: ['', '1'],
    env: 'echo ${FOO:-unset}', sandboxEnv: 'echo $CF_LANG_ENV',
    cwd: 'pwd', forever: 'sleep 1000',
    eprint: 'echo oops >&2', live: 'echo a; sleep 2; echo b',
  },
}

// shown returns what an execution showed: its last value, or for bash its
// output.
function shown(ex, lang) {
  assert.equal(ex.error, undefined, `${lang}: ${JSON.stringify(ex.error)}`)
  if (LANGS[lang].value === null) return ex.logs.stdout.join('').trim()
  const texts = ex.results.filter((r) => r.text !== undefined).map((r) => r.text)
  assert.ok(texts.length > 0, `${lang}: no value in ${JSON.stringify(ex)}`)
  return texts.at(-1).trim()
}

// quoted is how a string value shows in lang (R prints its vectors).
const quoted = (lang, s) => (lang === 'r' ? `[1] "${s}"` : s)

// gone asserts that x is not defined (bash: empty, so x + 2 is 2).
function gone(ex) {
  assert.ok(ex.error !== undefined || ex.logs.stdout.join('').trim() === '2', JSON.stringify(ex))
}

// The languages' tests run side by side (each language's in order): their
// kernels are separate processes, and most of the time goes in waiting.
describe('languages', { concurrency: true }, () => {
  for (const [lang, c] of Object.entries(LANGS)) {
    describe(lang, { concurrency: false }, () => {
      test('keeps state between executions, and returns values', T, async () => {
        assert.equal((await ci.runCode(c.set, { language: lang })).error, undefined)
        assert.equal(shown(await ci.runCode(c.get, { language: lang }), lang), c.value ?? '42')
        // The aliases E2B's SDKs send reach the same default context.
        if (lang === 'javascript' || lang === 'typescript') {
          assert.equal(shown(await ci.runCode(c.get, { language: lang.slice(0, 1) + 's' }), lang), '42')
        }
      })

      test('streams stdout and stderr', T, async () => {
        const out = []
        let ex = await ci.runCode(c.print, { language: lang, onStdout: (m) => out.push(m) })
        assert.equal(ex.error, undefined)
        assert.equal(ex.logs.stdout.join(''), 'hello\n')
        assert.equal(out.map((m) => m.line).join(''), 'hello\n')
        assert.ok(out.every((m) => m.error === false))
        const err = []
        ex = await ci.runCode(c.eprint, { language: lang, onStderr: (m) => err.push(m) })
        assert.equal(ex.error, undefined)
        assert.equal(ex.logs.stderr.join(''), 'oops\n')
        assert.equal(err.map((m) => m.line).join(''), 'oops\n')
        assert.ok(err.every((m) => m.error === true))
      })

      if (c.live) {
        test('output comes as it is written, not when the cell ends', T, async () => {
          const seen = []
          const t0 = Date.now()
          const ex = await ci.runCode(c.live, { language: lang, onStdout: (m) => seen.push([Date.now(), m.line]) })
          const end = Date.now()
          assert.equal(ex.error, undefined)
          assert.equal(seen.map(([, line]) => line).join(''), 'a\nb\n')
          const first = seen.find(([, line]) => line.startsWith('a'))[0]
          assert.ok(end - first > 1_500, `first output ${first - t0} ms after the start, ${end - first} ms before the end`)
        })
      }

      test('errors in E2B\'s shapes, and the kernel lives on', T, async () => {
        const errors = []
        const ex = await ci.runCode(c.fail, { language: lang, onError: (e) => errors.push(e) })
        assert.deepEqual([ex.error?.name, ex.error?.value], c.error)
        assert.equal(typeof ex.error.traceback, 'string')
        assert.deepEqual(errors.map((e) => e.name), [c.error[0]])
        assert.equal((await ci.runCode(c.print, { language: lang })).logs.stdout.join(''), 'hello\n')
      })

      test('environment variables: the sandbox\'s, and the execution\'s for that execution only', T, async () => {
        const run = async (code, envs) => shown(await ci.runCode(code, { language: lang, envs }), lang)
        assert.equal(await run(c.sandboxEnv), quoted(lang, 'sandbox-level'))
        assert.equal(await run(c.env, { FOO: 'bar' }), quoted(lang, 'bar'))
        assert.equal(await run(c.env), quoted(lang, 'unset'))
        assert.equal(await run(c.sandboxEnv, { CF_LANG_ENV: 'override' }), quoted(lang, 'override'))
        assert.equal(await run(c.sandboxEnv), quoted(lang, 'sandbox-level'))
      })

      test('cwd: the home by default, a context\'s own', T, async () => {
        assert.equal(shown(await ci.runCode(c.cwd, { language: lang }), lang), quoted(lang, '/home/user'))
        const ctx = await ci.createCodeContext({ language: lang, cwd: '/tmp' })
        try {
          assert.equal(ctx.language, lang)
          assert.equal(ctx.cwd, '/tmp')
          assert.equal(shown(await ci.runCode(c.cwd, { context: ctx }), lang), quoted(lang, '/tmp'))
          // A context of its own: the default context's x is not there.
          gone(await ci.runCode(c.get, { context: ctx }))
        } finally {
          await ci.removeCodeContext(ctx)
        }
      })

      test('a timeout interrupts the cell; the context keeps its state', T, async () => {
        // The default context, where x is 40.
        const t0 = Date.now()
        await assert.rejects(ci.runCode(c.forever, { language: lang, timeoutMs: 2_000 }), TimeoutError)
        assert.ok(Date.now() - t0 < 15_000)
        // The kernel answers again, with its state.
        assert.equal(shown(await ci.runCode(c.get, { language: lang, timeoutMs: 60_000 }), lang), c.value ?? '42')
      })
    })
  }
})

describe('contexts', () => {
  test('the defaults are python and javascript in the home; a new one is listed last', T, async () => {
    const contexts = await ci.listCodeContexts()
    assert.deepEqual(contexts.slice(0, 2).map((c) => [c.language, c.cwd]), [['python', '/home/user'], ['javascript', '/home/user']])
    const ctx = await ci.createCodeContext({ language: 'r' })
    try {
      assert.equal((await ci.listCodeContexts()).at(-1).id, ctx.id)
    } finally {
      await ci.removeCodeContext(ctx)
    }
    assert.ok(!(await ci.listCodeContexts()).some((c) => c.id === ctx.id), 'removed')
  })

  test('contexts of one language are independent', T, async () => {
    const a = await ci.createCodeContext({ language: 'js' })
    const b = await ci.createCodeContext({ language: 'javascript' })
    try {
      assert.equal(a.language, 'javascript')
      assert.equal(b.language, 'javascript')
      await ci.runCode('var onlyInA = 1', { context: a })
      assert.equal((await ci.runCode('typeof onlyInA', { context: b })).text, 'undefined')
      assert.equal((await ci.runCode('typeof onlyInA', { context: a })).text, 'number')
    } finally {
      await ci.removeCodeContext(a)
      await ci.removeCodeContext(b)
    }
  })
})

test('javascript: imports, top-level await, repeated declarations', T, async () => {
  const ex = await ci.runCode("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", { language: 'js' })
  assert.deepEqual(ex.logs.stdout, ['function\n'])
  assert.equal((await ci.runCode("await Promise.resolve('Hello World!')", { language: 'js' })).text, 'Hello World!')
  assert.equal((await ci.runCode("(await import('path')).basename('/a/b')", { language: 'js' })).text, 'b')
  assert.equal((await ci.runCode("import * as os from 'os'\ntypeof os.platform()", { language: 'ts' })).text, 'string')
  assert.equal((await ci.runCode('const again = 1; const again2 = again', { language: 'js' })).error, undefined)
  assert.equal((await ci.runCode('const again = 2; again', { language: 'js' })).text, '2')
})

test('java: println writes its text, then the line end', T, async () => {
  const ex = await ci.runCode('System.out.println("Hello, World!")', { language: 'java' })
  assert.equal(ex.logs.stdout[0], 'Hello, World!')
  assert.equal(ex.logs.stdout.join(''), 'Hello, World!\n')
})

// interpreter POSTs body to path on the sandbox's code interpreter as the
// SDK does, for what the SDK does not show (its errors carry only the
// status; when the headers came).
async function interpreter(path, body) {
  return fetch(`${env().sandboxUrl}${path}`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json', 'E2b-Sandbox-Id': ci.sandboxId, 'E2b-Sandbox-Port': '49999',
      ...(token ? { 'X-Access-Token': token } : {}),
    },
    body: JSON.stringify(body),
  })
}

// contextRefusal creates a context as the SDK does and returns the
// daemon's answer.
async function contextRefusal(body) {
  const res = await interpreter('/contexts', body)
  return { status: res.status, text: await res.text() }
}

test('refusals: an unknown language, a cwd that is missing or that the kernels\' user cannot enter', T, async () => {
  const is400 = (e) => e instanceof SandboxError && /^400\b/.test(e.message)
  // (The SDK leaves its request timer running when /execute is refused; a
  // short one keeps it from holding the test process open for a minute.)
  await assert.rejects(ci.runCode('1', { language: 'cobol', requestTimeoutMs: 2_000 }), is400)
  await assert.rejects(ci.createCodeContext({ language: 'cobol' }), is400)
  await assert.rejects(ci.createCodeContext({ cwd: '/no/such/dir' }), is400)
  // Kernels run as the sandbox's user, who cannot enter /root (E2B's run
  // as root): a clear 400, not a 500.
  await assert.rejects(ci.createCodeContext({ language: 'python', cwd: '/root' }), is400)
  let res = await contextRefusal({ language: 'python', cwd: '/root' })
  assert.equal(res.status, 400)
  assert.match(res.text, /permission denied/)
  res = await contextRefusal({ language: 'cobol' })
  assert.equal(res.status, 400)
  assert.match(res.text, /not supported/)
  res = await contextRefusal({ cwd: '/no/such/dir' })
  assert.equal(res.status, 400)
  assert.match(res.text, /does not exist/)
  // A context and a language together: the SDK refuses before sending.
  await assert.rejects(ci.runCode('1', { language: 'js', context: (await ci.listCodeContexts())[0] }), InvalidArgumentError)
})

test('/execute sends its headers at once, before silent code ends', T, async () => {
  const t0 = Date.now()
  const res = await interpreter('/execute', { code: 'import time; time.sleep(2); 7' })
  const headersAfter = Date.now() - t0
  assert.equal(res.status, 200)
  const body = await res.text()
  const endAfter = Date.now() - t0
  assert.ok(headersAfter < 1_000, `headers after ${headersAfter} ms`)
  assert.ok(endAfter >= 2_000, `body done after ${endAfter} ms`)
  assert.ok(body.split('\n').some((l) => l && JSON.parse(l).text === '7'), body)
})

test('a kill during silent code is reported as the kill', T, async () => {
  // /execute sends its headers at once, so a sandbox killed while the code
  // prints nothing breaks a started stream, which the SDK reports as a
  // kill.
  const sbx = await sandbox({}, undefined, Sandbox)
  const timer = setTimeout(() => { sbx.kill() }, 2_000)
  try {
    await assert.rejects(sbx.runCode('import time; time.sleep(300)', { timeoutMs: 120_000 }),
      (e) => e instanceof TimeoutError && /sandbox was killed while the request was in progress/.test(e.message))
  } finally {
    clearTimeout(timer)
  }
})
