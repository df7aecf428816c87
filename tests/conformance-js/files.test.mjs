// Files as E2B's envd does them, through the official e2b package:
// relative paths resolve against the user's home in every file operation,
// removing what does not exist succeeds, an upload without metadata clears
// the old, /proc and /sys files read, and watches take relative paths.
import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'

import { FileNotFoundError, FilesystemEventType, FileType } from 'e2b'

import { sandbox, unique, waitUntil } from './helpers.mjs'

const T = { timeout: 60_000 }
let sbx

before(async () => {
  sbx = await sandbox()
})

describe('relative paths are the home directory\'s', () => {
  test('write, read, exists, getInfo', T, async () => {
    const name = `${unique()}.txt`
    const info = await sbx.files.write(name, 'relative')
    assert.equal(info.path, `/home/user/${name}`)
    assert.equal(await sbx.files.read(name), 'relative')
    assert.equal(await sbx.files.read(`/home/user/${name}`), 'relative')
    assert.equal(await sbx.files.exists(name), true)
    const entry = await sbx.files.getInfo(name)
    assert.equal(entry.path, `/home/user/${name}`)
    assert.equal(entry.type, FileType.FILE)
    // As root, the home is /root.
    await sbx.files.write(name, 'root', { user: 'root' })
    assert.equal((await sbx.files.getInfo(name, { user: 'root' })).path, `/root/${name}`)
    assert.equal(await sbx.files.read(name), 'relative')
  })

  test('writeFiles, octet-stream and multipart', T, async () => {
    const dir = unique('multi')
    const infos = await sbx.files.write([
      { path: `${dir}/a.txt`, data: 'a' },
      { path: `${dir}/sub/b.txt`, data: 'b' },
    ])
    assert.deepEqual(infos.map((i) => i.path), [`/home/user/${dir}/a.txt`, `/home/user/${dir}/sub/b.txt`])
    const stream = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode('streamed')); c.close() } })
    const one = await sbx.files.write(`${dir}/c.bin`, stream, { useOctetStream: true })
    assert.equal(one.path, `/home/user/${dir}/c.bin`)
    assert.equal(await sbx.files.read(`${dir}/c.bin`), 'streamed')
  })

  test('makeDir, list, rename, remove', T, async () => {
    const dir = unique('dir')
    assert.equal(await sbx.files.makeDir(`${dir}/nested`), true)
    assert.equal(await sbx.files.makeDir(`${dir}/nested`), false)
    await sbx.files.write(`${dir}/f.txt`, 'f')
    const listed = await sbx.files.list(dir)
    assert.deepEqual(listed.map((e) => e.path).sort(), [`/home/user/${dir}/f.txt`, `/home/user/${dir}/nested`])
    const moved = await sbx.files.rename(`${dir}/f.txt`, `${dir}/nested/g.txt`)
    assert.equal(moved.path, `/home/user/${dir}/nested/g.txt`)
    assert.equal(await sbx.files.exists(`${dir}/f.txt`), false)
    await sbx.files.remove(dir)
    assert.equal(await sbx.files.exists(dir), false)
  })

  test('missing relative paths are not found', T, async () => {
    const name = unique('missing')
    await assert.rejects(sbx.files.read(name), FileNotFoundError)
    await assert.rejects(sbx.files.getInfo(name), FileNotFoundError)
    await assert.rejects(sbx.files.list(name), FileNotFoundError)
    await assert.rejects(sbx.files.rename(name, `${name}-2`), FileNotFoundError)
    await assert.rejects(sbx.files.watchDir(name, () => {}), FileNotFoundError)
  })

  test('watchDir', T, async () => {
    const dir = unique('watch')
    await sbx.files.makeDir(dir)
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push(e))
    try {
      await sbx.files.write(`${dir}/w.txt`, 'watched')
      await waitUntil(() => events.some((e) => e.type === FilesystemEventType.WRITE && e.name === 'w.txt'), 10_000,
        'a WRITE event for w.txt')
    } finally {
      await handle.stop()
    }
  })
})

test('removing what does not exist succeeds', T, async () => {
  await sbx.files.remove(unique('never-existed'))
  await sbx.files.remove(`/tmp/${unique('never-existed')}/below`)
})

test('an upload without metadata clears the old metadata', T, async () => {
  const name = `${unique('meta')}.txt`
  const first = await sbx.files.write(name, 'first', { metadata: { Author: 'mish', stage: 'raw' } })
  assert.deepEqual(first.metadata, { author: 'mish', stage: 'raw' })
  assert.deepEqual((await sbx.files.getInfo(name)).metadata, { author: 'mish', stage: 'raw' })
  await sbx.files.write(name, 'second', { metadata: { stage: 'clean' } })
  assert.deepEqual((await sbx.files.getInfo(name)).metadata, { stage: 'clean' })
  const plain = await sbx.files.write(name, 'third')
  assert.ok(!plain.metadata || Object.keys(plain.metadata).length === 0, `upload answered ${JSON.stringify(plain.metadata)}`)
  const md = (await sbx.files.getInfo(name)).metadata
  assert.ok(!md || Object.keys(md).length === 0, `metadata left: ${JSON.stringify(md)}`)
  assert.equal(await sbx.files.read(name), 'third')
})

test('/proc and /sys files read (size 0, not seekable)', T, async () => {
  const bootId = (await sbx.files.read('/proc/sys/kernel/random/boot_id')).trim()
  assert.match(bootId, /^[0-9a-f-]{36}$/)
  assert.equal(bootId, (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim())
  assert.equal((await sbx.files.getInfo('/proc/sys/kernel/random/boot_id')).size, 0)
  assert.match(await sbx.files.read('/proc/self/status'), /^Name:/)
  const mounts = await sbx.files.read('/proc/mounts', { format: 'bytes' })
  assert.ok(mounts.length > 0)
})
