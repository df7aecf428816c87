// Custom templates through the official e2b npm package's Template,
// unmodified: built from code, from a Dockerfile and from an image in a
// local registry; a start command serving HTTP that answers the moment a
// sandbox of the template exists; a rebuild that changes one step runs only
// that step; and clear errors (a bad Dockerfile, missing files, a failing
// step, an unknown user, a registry that is down) that leave nothing
// behind. Builds cost CPU: one template from the base image serves the
// first three tests, the others are busybox images.
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'

import { BuildError, Template, waitForPort } from 'e2b'

import { api, env, sandbox, unique, waitUntil } from './helpers.mjs'
import { startRegistry } from './registry.mjs'

const T = { timeout: 300_000 }
const THIS_FILE = fileURLToPath(import.meta.url)
const names = []
let registry
let ctx

// newName returns a template name, deleted after the file's tests.
function newName() {
  const n = unique('cfjs')
  names.push(n)
  return n
}

// build builds template as name and returns the build's info and log.
async function build(template, name, opts = {}) {
  const logs = []
  try {
    const info = await Template.build(template, name, {
      cpuCount: 1, memoryMB: 512, ...opts, onBuildLogs: (e) => logs.push(e.message),
    })
    return { info, logs }
  } catch (e) {
    e.logs = logs
    throw e
  }
}

// get GETs p from a sandbox's port through the daemon, routed as E2B's
// edge routes it (E2B_SANDBOX_URL is one host here), without retrying.
async function get(sbx, port, p) {
  const res = await fetch(`${env().sandboxUrl}${p}`, {
    headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': String(port) },
  })
  return { status: res.status, body: await res.text() }
}

// lineOf returns the line of this file marked /* step:<mark> */.
function lineOf(mark) {
  const text = `/* step:${mark} */`
  const lines = fs.readFileSync(THIS_FILE, 'utf8').split('\n')
  const at = lines.flatMap((l, i) => (l.includes(text) ? [i + 1] : []))
  assert.equal(at.length, 1, `${text} is on lines ${at}`)
  return at[0]
}

before(async () => {
  env()
  registry = await startRegistry()
  ctx = fs.mkdtempSync(path.join(os.tmpdir(), 'cfjs-templates-'))
  fs.mkdirSync(path.join(ctx, 'site'))
  fs.writeFileSync(path.join(ctx, 'site', 'index.html'), '<h1>from the template</h1>')
  fs.writeFileSync(path.join(ctx, 'site', 'data.txt'), 'data')
  fs.mkdirSync(path.join(ctx, 'app'))
  fs.writeFileSync(path.join(ctx, 'app', 'index.html'), 'dockerfile site')
})

after(async () => {
  await Promise.allSettled(names.map((n) => api('DELETE', `/templates/${n}`)))
  await registry?.close()
  if (ctx) fs.rmSync(ctx, { recursive: true, force: true })
})

// The template from code: its last step varies.
function web(last) {
  return Template({ fileContextPath: ctx })
    .fromBaseImage()
    .copy('site/*', '/srv/www/')
    .setEnvs({ GREETING: 'hello' })
    .setWorkdir('/srv')
    .runCmd('echo $GREETING > greeting.txt')
    .runCmd(last)
    .setStartCmd('python3 -m http.server 8000 --directory /srv/www', waitForPort(8000))
}

describe('a template from code', () => {
  const name = newName()
  let first
  let sbx

  test('builds, and its start command answers the moment a sandbox exists', T, async () => {
    const { info, logs } = await build(web('echo built > /srv/built.txt'), name)
    first = info
    assert.ok(info.templateId && info.buildId, JSON.stringify(info))
    assert.ok(logs.some((m) => m.startsWith('Template is ready')), logs.join('\n'))
    assert.equal(await Template.exists(name), true)
    sbx = await sandbox({}, name)
    // No retry: the server was up before the sandbox was handed out.
    const res = await get(sbx, 8000, '/index.html')
    assert.equal(res.status, 200, res.body)
    assert.equal(res.body, '<h1>from the template</h1>')
    const out = await sbx.commands.run('cat greeting.txt built.txt; pwd; whoami')
    assert.equal(out.stdout, 'hello\nbuilt\n/srv\nroot\n')
  })

  test('a rebuild that changes its last step runs only that step', T, async () => {
    assert.ok(first, 'the first build failed')
    // The token keeps the step new on a daemon that ran this test before.
    const token = unique('v')
    const { info, logs } = await build(web(`echo rebuilt ${token} > /srv/built.txt`), name)
    assert.notEqual(info.buildId, first.buildId)
    const cached = logs.filter((m) => m.startsWith('CACHED [builder '))
    assert.equal(cached.length, 4, logs.join('\n'))
    assert.ok(logs.includes('4 of 5 steps came from the cache'), logs.join('\n'))
    assert.ok(logs.some((m) => m.startsWith('[builder 5/5] RUN echo rebuilt')), logs.join('\n'))
    const again = await sandbox({}, name)
    assert.equal((await again.commands.run('cat /srv/built.txt')).stdout, `rebuilt ${token}\n`)
    assert.equal((await get(again, 8000, '/data.txt')).body, 'data')
    // A sandbox of the first build keeps it.
    assert.equal((await sbx.commands.run('cat /srv/built.txt')).stdout, 'built\n')
  })
})

test('a template from a Dockerfile on an image in the local registry', T, async () => {
  const ref = await registry.push('cellfork/busybox', 'dockerfile')
  const name = newName()
  const template = Template({ fileContextPath: ctx })
    .fromDockerfile(`FROM ${ref}
ARG GREETING=hi
ENV WHO=dockerfile
WORKDIR /www
COPY app/index.html ./
RUN echo "$GREETING $WHO" > /www/who.txt
USER root
`)
    .setStartCmd('httpd -f -p 8081 -h /www', 'wget -q -O /dev/null http://127.0.0.1:8081/')
  await build(template, name)
  const sbx = await sandbox({}, name)
  const who = await get(sbx, 8081, '/who.txt')
  assert.equal(who.status, 200, who.body)
  assert.equal(who.body, 'hi dockerfile\n')
  assert.equal((await get(sbx, 8081, '/index.html')).body, 'dockerfile site')
  const out = await sbx.commands.run('pwd; whoami; echo $WHO')
  assert.equal(out.stdout, '/www\nroot\ndockerfile\n')
})

test('a template from an image in the local registry, with tags', T, async () => {
  const ref = await registry.push('cellfork/busybox', 'image', { 'etc/motd': 'from the registry\n' })
  const name = newName()
  const template = Template()
    .fromImage(ref)
    .runCmd('cat /etc/motd > /motd.copy')
    .makeSymlink('/motd.copy', '/motd.link')
    .setUser('app')
    .runCmd('id -un > /tmp/built-by')
  const { info } = await build(template, `${name}:v1`)
  assert.ok(info.tags.includes('v1'), JSON.stringify(info))
  const sbx = await sandbox({}, `${name}:v1`)
  assert.equal((await sbx.commands.run('cat /motd.link /tmp/built-by; id -un')).stdout, 'from the registry\napp\napp\n')
  const assigned = await Template.assignTags(`${name}:v1`, ['stable'])
  assert.ok(assigned.tags.includes('stable'))
  assert.equal(assigned.buildId, info.buildId)
  const tags = (await Template.getTags(name)).map((t) => t.tag)
  assert.ok(tags.includes('v1') && tags.includes('stable'), tags.join(','))
  await assert.rejects(Template.assignTags(`${name}:v1`, ':bad'))
})

describe('errors are clear and leave nothing behind', () => {
  let ref
  const failed = []

  before(async () => {
    ref = await registry.push('cellfork/busybox', 'errors')
  })

  // expectBuildError builds template as a new name and checks the error's
  // message and that its stack points at the line of this file marked
  // /* step:<mark> */: the step the daemon named.
  async function expectBuildError(template, message, mark) {
    const name = newName()
    failed.push(name)
    const err = await build(template, name).then(() => assert.fail('the build succeeded'), (e) => e)
    assert.ok(err instanceof BuildError, `${err}`)
    assert.ok(err.message.includes(message), `${err.message} (want ${message})`)
    if (mark) assert.ok(err.stack.includes(`${path.basename(THIS_FILE)}:${lineOf(mark)}:`), err.stack)
    return err
  }

  test('a bad Dockerfile', T, async () => {
    // The SDK reads Dockerfiles itself: these never reach the daemon.
    assert.throws(() => Template().fromDockerfile('RUN echo no FROM'), /must contain a FROM instruction/)
    assert.throws(() => Template().fromDockerfile(`FROM ${ref} AS a\nFROM ${ref}\nCOPY --from=a /x /y`), /Multi-stage/)
    // These do: an image that is not there, a RUN that fails.
    const missing = Template().fromDockerfile(`FROM ${registry.host}/cellfork/nosuchimage:1`) /* step:from */
    await expectBuildError(missing, `image "${registry.host}/cellfork/nosuchimage:1" not found`, 'from')
    await expectBuildError(Template().fromDockerfile(`FROM ${ref}\nRUN true\nRUN exit 7\n`),
      "failed to run command 'exit 7': exit status 7")
  })

  test('missing files: the build never starts, and the next one supersedes it', T, async () => {
    const name = newName()
    const err = await build(Template({ fileContextPath: ctx }).fromImage(ref).copy('nope.txt', '/nope.txt'), name)
      .then(() => assert.fail('the build succeeded'), (e) => e)
    assert.match(err.message, /No files found in .*nope\.txt/)
    // The SDK asked for the build before it looked for the files.
    const created = err.logs.map((m) => m.match(/^Template created with ID: ([^,]+), Build ID: (.+)$/)).find(Boolean)
    assert.ok(created, err.logs.join('\n'))
    const abandoned = { templateId: created[1], buildId: created[2] }
    assert.equal((await Template.getBuildStatus(abandoned)).status, 'waiting')
    await assert.rejects(sandbox({}, name), /has no ready build/)
    await build(Template().fromImage(ref).runCmd('true'), name)
    const st = await Template.getBuildStatus(abandoned)
    assert.equal(st.status, 'error')
    assert.equal(st.reason?.message, 'The build was canceled because it was superseded by a newer one.')
  })

  test('a failing step names its command and step', T, async () => {
    const template = Template()
      .fromImage(ref)
      .runCmd('true')
      .runCmd('exit 3') /* step:exit3 */
    await expectBuildError(template, "failed to run command 'exit 3': exit status 3", 'exit3')
  })

  test('an unknown user', T, async () => {
    await expectBuildError(Template().fromImage(ref).runCmd('whoami', { user: 'root123' }),
      "failed to run command 'whoami': command failed: unauthenticated: invalid username: 'root123'")
  })

  test('a registry that is down', T, async () => {
    const down = await startRegistry()
    try {
      const gone = await down.push('cellfork/busybox', '1')
      await down.down()
      const template = Template().fromImage(gone) /* step:down */
      await expectBuildError(template, 'is unreachable', 'down')
    } finally {
      await down.close()
    }
  })

  test('nothing is left behind', T, async () => {
    assert.ok(failed.length >= 5, `only ${failed.length} builds failed`)
    for (const name of failed) {
      const t = await api('GET', `/templates/${name}`)
      assert.equal(t.status, 200)
      assert.deepEqual(t.body.builds.map((b) => b.status), ['error'], `${name}: ${JSON.stringify(t.body.builds)}`)
      await assert.rejects(sandbox({}, name), /has no ready build/)
    }
    // On the daemon's disk (scripts/test.sh says where): no half-made
    // layers or images, no mounts, and of a failed build only its log.
    const data = process.env.CELLFORK_DATA_DIR
    if (!data) return
    const dir = path.join(data, 'custom-templates')
    const byName = await Promise.all(failed.map(async (n) => (await api('GET', `/templates/${n}`)).body.builds[0].buildID))
    await waitUntil(() => {
      const half = fs.readdirSync(path.join(dir, 'layers')).filter((e) => e.includes('.tmp-'))
      const mounts = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(dir))
      return half.length === 0 && mounts.length === 0
    }, 30_000, 'no half-made layers and no mounts under custom-templates')
    for (const id of byName) {
      assert.deepEqual(fs.readdirSync(path.join(dir, 'builds', id)), ['log.jsonl'], `build ${id}`)
    }
  })
})
