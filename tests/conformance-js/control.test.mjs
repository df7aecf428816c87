// The control plane as E2B's API answers it, through the official e2b
// package: the list is newest first, setTimeout(0) expires the sandbox now,
// metrics are a history that start and end select from, a filesystem-only
// pause (keepMemory: false, and onTimeout's keepMemory: false) reboots the
// sandbox from its files on resume, boot ids (a memory pause keeps it, a
// cold start draws its own), and the built-in templates' aliases.
import assert from 'node:assert/strict'
import { describe, test } from 'node:test'

import { Sandbox, SandboxNotFoundError, Template } from 'e2b'

import { api, RUN_TAG, sandbox, sleep, unique, waitUntil } from './helpers.mjs'

const T = { timeout: 90_000 }
const BOOT_ID = '/proc/sys/kernel/random/boot_id'

// read returns a file's text as the sandbox's shell sees it.
async function read(sbx, path) {
  return (await sbx.commands.run(`cat ${path}`)).stdout.trim()
}

test('the list is newest first by default, oldest first with order asc', T, async () => {
  const group = { 'cf-newest': unique('n') }
  const first = await sandbox({ metadata: group })
  await sleep(50)
  const second = await sandbox({ metadata: group })
  const ids = async (opts) => (await Sandbox.list({ query: { metadata: group }, ...opts }).nextItems()).map((s) => s.sandboxId)
  assert.deepEqual(await ids({ limit: 1 }), [second.sandboxId], 'the first page of one is the newest')
  assert.deepEqual(await ids({}), [second.sandboxId, first.sandboxId])
  assert.deepEqual(await ids({ order: 'asc', limit: 1 }), [first.sandboxId])
})

test('setTimeout(0) is accepted and expires the sandbox now', T, async () => {
  const sbx = await sandbox()
  await sbx.setTimeout(0)
  await waitUntil(async () => !(await sbx.isRunning()), 10_000, 'the sandbox to expire')
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
})

test('metrics are a history that start and end select from', T, async () => {
  const created = Date.now()
  const sbx = await sandbox()
  // A request that reaches now takes a sample (at most one a second): poll
  // until the history spans more than 7 s, so that an end 5 s in the past
  // is a range of its own.
  const all = await waitUntil(async () => {
    const ms = await sbx.getMetrics()
    return ms.length >= 2 && ms.at(-1).timestamp - ms[0].timestamp > 7_000 && ms
  }, 30_000, 'a history of more than 7 s')
  for (const m of all) {
    assert.ok(m.timestamp instanceof Date)
    assert.ok(m.timestamp.getTime() >= created - 10_000 && m.timestamp.getTime() <= Date.now() + 10_000, m.timestamp)
    assert.ok(m.memTotal > 0 && m.cpuCount > 0, JSON.stringify(m))
  }
  const stamps = all.map((m) => m.timestamp.getTime())
  assert.deepEqual(stamps, [...stamps].sort((a, b) => a - b), 'oldest first')
  const first = stamps[0]
  const last = stamps.at(-1)
  // The SDK sends whole seconds.
  const upToFirst = await sbx.getMetrics({ end: new Date(Math.ceil(first / 1000) * 1000) })
  assert.ok(upToFirst.length >= 1, 'the first sample is in a range ending at it')
  assert.ok(upToFirst.every((m) => m.timestamp.getTime() <= Math.ceil(first / 1000) * 1000), 'nothing after end')
  assert.ok(!upToFirst.some((m) => m.timestamp.getTime() === last), 'the last sample is after end')
  const fromLast = await sbx.getMetrics({ start: new Date(Math.floor(last / 1000) * 1000) })
  assert.ok(fromLast.some((m) => m.timestamp.getTime() === last), 'the last sample is in a range starting at it')
  assert.ok(fromLast.every((m) => m.timestamp.getTime() >= Math.floor(last / 1000) * 1000), 'nothing before start')
  const hourAgo = Date.now() - 3_600_000
  assert.deepEqual(await sbx.getMetrics({ start: new Date(hourAgo), end: new Date(hourAgo + 1_800_000) }), [])
})

describe('pause', () => {
  test('filesystem-only (keepMemory: false): files kept, a fresh boot, no processes', T, async () => {
    const sbx = await sandbox()
    const boot = await read(sbx, BOOT_ID)
    await sbx.files.write('/home/user/kept.txt', 'kept')
    await sbx.commands.run('sleep 4242', { background: true })
    assert.equal(await sbx.pause({ keepMemory: false }), true)
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
    const raw = await api('GET', `/sandboxes/${sbx.sandboxId}`)
    assert.equal(raw.body.pauseMode, 'filesystem')
    assert.equal(await sbx.pause(), false, 'pausing a paused sandbox')
    // Traffic does not reboot it (E2B: it must be resumed by connect).
    assert.equal(await sbx.isRunning(), false)
    const resumed = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await read(resumed, '/home/user/kept.txt'), 'kept', 'its files came back')
    assert.notEqual(await read(resumed, BOOT_ID), boot, 'it booted afresh')
    const left = await resumed.commands.run("ps -eo args | grep -c '[s]leep 4242' || true")
    assert.equal(left.stdout.trim(), '0', 'its processes did not come back')
    assert.equal((await resumed.commands.run('echo alive')).stdout, 'alive\n')
  })

  test('a memory pause keeps the boot id; onResume reboot draws a new one', T, async () => {
    const sbx = await sandbox()
    const boot = await read(sbx, BOOT_ID)
    await sbx.files.write('/home/user/kept.txt', 'kept')
    await sbx.commands.run('sleep 4343', { background: true })
    assert.equal(await sbx.pause(), true)
    assert.equal((await api('GET', `/sandboxes/${sbx.sandboxId}`)).body.pauseMode, 'full')
    let resumed = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await read(resumed, BOOT_ID), boot, 'restored, not booted')
    const alive = await resumed.commands.run("ps -eo args | grep -c '[s]leep 4343' || true")
    assert.equal(alive.stdout.trim(), '1', 'its processes came back')
    assert.equal(await resumed.pause(), true)
    resumed = await Sandbox.connect(sbx.sandboxId, { onResume: 'reboot' })
    assert.equal(await read(resumed, '/home/user/kept.txt'), 'kept')
    assert.notEqual(await read(resumed, BOOT_ID), boot, 'rebooted')
  })

  test('onTimeout pause with keepMemory false pauses filesystem-only', T, async () => {
    const sbx = await sandbox({ timeoutMs: 3_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
    assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: false })
    const boot = await read(sbx, BOOT_ID)
    await sbx.files.write('/home/user/kept.txt', 'kept')
    await waitUntil(async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 20_000, 'the timeout to pause it')
    assert.equal((await api('GET', `/sandboxes/${sbx.sandboxId}`)).body.pauseMode, 'filesystem')
    const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    assert.equal(await read(resumed, '/home/user/kept.txt'), 'kept')
    assert.notEqual(await read(resumed, BOOT_ID), boot)
  })

  test('autoResume with a filesystem-only auto-pause is refused', T, async () => {
    // The SDK refuses it before sending; the daemon refuses it too.
    await assert.rejects(sandbox({ lifecycle: { onTimeout: { action: 'pause', keepMemory: false }, autoResume: true } }),
      /autoResume/)
    const res = await api('POST', '/sandboxes', {
      templateID: 'base', timeout: 30, metadata: RUN_TAG,
      autoPause: true, autoPauseMemory: false, autoResume: { enabled: true },
    })
    if (res.body?.sandboxID) await Sandbox.kill(res.body.sandboxID)
    assert.equal(res.status, 400, JSON.stringify(res.body))
    assert.match(res.body.message, /autoResume/i)
  })
})

test('each sandbox that boots draws its own boot id', T, async () => {
  // A filesystem-only resume boots; two such sandboxes must not share the
  // id their warm image had.
  const [a, b] = await Promise.all([sandbox(), sandbox()])
  for (const s of [a, b]) assert.equal(await s.pause({ keepMemory: false }), true)
  const [ra, rb] = await Promise.all([Sandbox.connect(a.sandboxId), Sandbox.connect(b.sandboxId)])
  const [ia, ib] = await Promise.all([read(ra, BOOT_ID), read(rb, BOOT_ID)])
  assert.match(ia, /^[0-9a-f-]{36}$/)
  assert.notEqual(ia, ib)
})

test('the built-in templates have aliases', T, async () => {
  for (const name of ['base', 'code-interpreter-v1']) assert.equal(await Template.exists(name), true, name)
  assert.equal(await Template.exists(unique('no-such-template')), false)
  const res = await api('GET', '/templates/aliases/base')
  assert.equal(res.status, 200)
  assert.equal(typeof res.body.templateID, 'string')
})
