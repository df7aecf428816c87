// Commands as E2B's envd runs them: a relative cwd is the user's home's,
// and the base template has `python` as well as `python3`.
import assert from 'node:assert/strict'
import { before, test } from 'node:test'

import { CommandExitError } from 'e2b'

import { sandbox, unique } from './helpers.mjs'

const T = { timeout: 60_000 }
let sbx

before(async () => {
  sbx = await sandbox()
})

test('a relative cwd is the home directory\'s', T, async () => {
  const dir = unique('cwd')
  await sbx.files.makeDir(`${dir}/sub`)
  assert.equal((await sbx.commands.run('pwd', { cwd: dir })).stdout, `/home/user/${dir}\n`)
  assert.equal((await sbx.commands.run('pwd', { cwd: `${dir}/sub/..` })).stdout, `/home/user/${dir}\n`)
  await sbx.files.makeDir(dir, { user: 'root' })
  assert.equal((await sbx.commands.run('pwd', { cwd: dir, user: 'root' })).stdout, `/root/${dir}\n`)
  // Background commands too.
  const handle = await sbx.commands.run('pwd', { cwd: dir, background: true })
  assert.equal((await handle.wait()).stdout, `/home/user/${dir}\n`)
})

test('a relative cwd that does not exist is refused', T, async () => {
  await assert.rejects(sbx.commands.run('pwd', { cwd: unique('nope') }), (e) => !(e instanceof CommandExitError))
})

test('python is python3', T, async () => {
  const py = await sbx.commands.run('python --version')
  const py3 = await sbx.commands.run('python3 --version')
  assert.match(py.stdout, /^Python 3\./)
  assert.equal(py.stdout, py3.stdout)
})
