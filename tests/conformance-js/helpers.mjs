// Shared by the conformance tests: the environment check and a sandbox
// factory whose sandboxes are killed when the test file ends.
import assert from 'node:assert/strict'
import { after } from 'node:test'
import { randomUUID } from 'node:crypto'

import { Sandbox } from 'e2b'

const REQUIRED = ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']

// env returns the daemon's environment. A missing variable fails the test
// (never skips it): scripts/test.sh exports them for its test daemon.
export function env() {
  for (const name of REQUIRED) {
    assert.ok(process.env[name], `${name} is not set: the JS conformance tests need a running cellfork daemon and ` +
      'E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY pointing at it (scripts/test.sh exports them)')
  }
  return { apiUrl: process.env.E2B_API_URL, sandboxUrl: process.env.E2B_SANDBOX_URL.replace(/\/$/, '') }
}

// The run's tag, on every sandbox the suite creates.
export const RUN_TAG = { 'cellfork-conformance-js': randomUUID().slice(0, 12) }

const made = []

// sandbox creates a sandbox (killed after the file's tests) of template
// (the class's default one without); opts go to cls.create, cls is e2b's
// Sandbox or a subclass (@e2b/code-interpreter's).
export async function sandbox(opts = {}, template, cls = Sandbox) {
  env()
  const o = { timeoutMs: 180_000, ...opts, metadata: { ...RUN_TAG, ...opts.metadata } }
  const sbx = await (template ? cls.create(template, o) : cls.create(o))
  made.push(sbx)
  return sbx
}

after(async () => {
  await Promise.allSettled(made.map((s) => s.kill()))
})

// api calls the daemon's control plane with the suite's key, for what the
// SDK does not show (a field it drops, a request it refuses to send).
export async function api(method, path, body) {
  const res = await fetch(`${env().apiUrl}${path}`, {
    method,
    headers: { 'X-API-KEY': process.env.E2B_API_KEY, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  })
  const text = await res.text()
  let json = null
  try { json = text ? JSON.parse(text) : null } catch { json = text }
  return { status: res.status, body: json }
}

// sleep waits ms milliseconds.
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// unique returns a fresh relative name.
export function unique(prefix = 'js') {
  return `${prefix}-${randomUUID().slice(0, 10)}`
}

// waitUntil polls check until it returns a truthy value, failing after
// timeoutMs with the last value or error.
export async function waitUntil(check, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    try {
      const v = await check()
      if (v) return v
      last = v
    } catch (e) {
      last = e
    }
    if (Date.now() > deadline) assert.fail(`timed out after ${timeoutMs} ms waiting for ${what}; last: ${last}`)
    await new Promise((r) => setTimeout(r, 200))
  }
}
