// A real container registry for the template tests, the Python suite's
// (tests/conformance/_registry.py: the CNCF distribution registry that
// scripts/setup.sh builds, and busybox images pushed over the registry
// API), driven over its stdin and stdout. Nothing reaches Docker Hub.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import fs from 'node:fs'
import readline from 'node:readline'
import { fileURLToPath } from 'node:url'

const PYTHON = fileURLToPath(new URL('../../.venv/bin/python', import.meta.url))
const PROGRAM = fileURLToPath(new URL('../conformance/_registry.py', import.meta.url))

// startRegistry starts a registry; its host is 127.0.0.1:PORT.
export async function startRegistry() {
  assert.ok(fs.existsSync(PYTHON), `${PYTHON} missing: run \`make setup\` (the registry helper is the Python suite's)`)
  const proc = spawn(PYTHON, [PROGRAM], { stdio: ['pipe', 'pipe', 'inherit'] })
  const lines = readline.createInterface({ input: proc.stdout })[Symbol.asyncIterator]()
  const exited = new Promise((resolve) => proc.on('exit', resolve))
  const next = async () => {
    const { value, done } = await lines.next()
    assert.ok(!done, 'the registry helper exited')
    const answer = JSON.parse(value)
    assert.ok(!answer.error, `registry helper: ${answer.error}`)
    return answer
  }
  const ask = async (req) => {
    proc.stdin.write(JSON.stringify(req) + '\n')
    return next()
  }
  const { host } = await next()
  return {
    host,
    // push pushes a busybox image with files (path -> text) as repo:tag
    // and returns its reference.
    push: async (repo, tag, files = {}) => (await ask({ push: repo, tag, files })).ref,
    // down stops the registry; its address then refuses connections.
    down: () => ask({ stop: true }),
    // close stops it and removes its files.
    close: async () => {
      proc.stdin.end()
      await exited
    },
  }
}
