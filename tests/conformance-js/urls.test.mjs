// URLs the SDK hands out, on a daemon reached on a single URL
// (E2B_SANDBOX_URL, no wildcard domain): signed download and upload URLs
// work as they are, with nothing added; getHost(port) names the sandbox
// port in the Host form the daemon routes.
import assert from 'node:assert/strict'
import http from 'node:http'
import { before, describe, test } from 'node:test'

import { env, sandbox, unique, waitUntil } from './helpers.mjs'

const T = { timeout: 60_000 }
let sbx

before(async () => {
  sbx = await sandbox()
})

describe('signed URLs on a single URL', () => {
  test('download, relative and absolute, with and without an expiry', T, async () => {
    const name = `${unique('dl')}.txt`
    await sbx.files.write(name, 'download me')
    for (const url of [
      await sbx.downloadUrl(name),
      await sbx.downloadUrl(`/home/user/${name}`, { useSignatureExpiration: 120_000 }),
    ]) {
      assert.ok(url.startsWith(`${env().sandboxUrl}/files?`), url)
      assert.ok(!url.includes(sbx.sandboxId), 'the URL names no sandbox')
      const res = await fetch(url)
      assert.equal(res.status, 200, await res.clone().text())
      assert.equal(await res.text(), 'download me')
    }
  })

  test('download as root', T, async () => {
    const name = `${unique('root')}.txt`
    await sbx.files.write(name, 'root file', { user: 'root' })
    const res = await fetch(await sbx.downloadUrl(name, { user: 'root', useSignatureExpiration: 10_000 }))
    assert.equal(res.status, 200)
    assert.equal(await res.text(), 'root file')
  })

  test('upload', T, async () => {
    const name = `${unique('up')}.txt`
    const form = new FormData()
    form.append('file', 'uploaded content')
    const res = await fetch(await sbx.uploadUrl(name, { useSignatureExpiration: 10_000 }), { method: 'POST', body: form })
    assert.equal(res.status, 200)
    assert.deepEqual(await res.json(), [{ name, path: `/home/user/${name}`, type: 'file' }])
    assert.equal(await sbx.files.read(name), 'uploaded content')
  })

  test('refusals are envd\'s', T, async () => {
    const name = `${unique('guarded')}.txt`
    await sbx.files.write(name, 'secret')
    let res = await fetch(await sbx.downloadUrl(name, { useSignatureExpiration: -10_000 }))
    assert.equal(res.status, 401)
    assert.deepEqual(await res.json(), { code: 401, message: 'signature is already expired' })

    const form = new FormData()
    form.append('file', 'x')
    res = await fetch(await sbx.uploadUrl(name, { useSignatureExpiration: -100_000 }), { method: 'POST', body: form })
    assert.equal(res.status, 401)
    assert.deepEqual(await res.json(), { code: 401, message: 'signature is already expired' })

    const tampered = (await sbx.downloadUrl(name)).replace('signature=v1_', 'signature=v1_A')
    res = await fetch(tampered)
    assert.equal(res.status, 401)
    assert.deepEqual(await res.json(), { code: 401, message: 'invalid signature' })

    // A read signature does not write; the file is untouched.
    res = await fetch(await sbx.downloadUrl(name), { method: 'POST', body: form })
    assert.equal(res.status, 401)
    assert.equal(await sbx.files.read(name), 'secret')

    // Without a signature the single URL is the control plane's.
    const bare = new URL(await sbx.downloadUrl(name))
    bare.searchParams.delete('signature')
    res = await fetch(bare)
    assert.equal(res.status, 401)
  })

  test('a URL signed by one sandbox opens only that one', T, async () => {
    const other = await sandbox()
    const name = `${unique('mine')}.txt`
    await sbx.files.write(name, 'in sbx')
    await other.files.write(name, 'in other')
    assert.equal(await (await fetch(await sbx.downloadUrl(name))).text(), 'in sbx')
    assert.equal(await (await fetch(await other.downloadUrl(name))).text(), 'in other')
  })
})

// get sends a GET to the daemon's single URL with the given Host header
// (fetch may not set Host).
function get(host, path = '/', headers = {}) {
  const base = new URL(env().sandboxUrl)
  return new Promise((resolve, reject) => {
    const req = http.request({ hostname: base.hostname, port: base.port, path, headers: { ...headers, host } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => { body += c })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

describe('getHost', () => {
  test('names the sandbox port on the daemon, and the daemon routes it', T, async () => {
    const base = new URL(env().sandboxUrl)
    const domain = ['127.0.0.1', '[::1]', 'localhost'].includes(base.hostname) ? `localhost:${base.port}` : base.host
    const host = sbx.getHost(8000)
    assert.equal(host, `8000-${sbx.sandboxId}.${domain}`)
    const dir = unique('www')
    await sbx.files.write(`${dir}/index.html`, '<h1>hi</h1>')
    const server = await sbx.commands.run('python -m http.server 8000', { cwd: dir, background: true })
    try {
      const res = await waitUntil(async () => {
        const r = await get(host, '/index.html')
        return r.status === 200 && r
      }, 20_000, 'the sandbox web server through its Host')
      assert.equal(res.body, '<h1>hi</h1>')
      // A closed port, and a sandbox that does not exist, as E2B answers.
      const closed = await get(sbx.getHost(8099))
      assert.equal(closed.status, 502)
      assert.equal(JSON.parse(closed.body).message, 'The sandbox is running but port is not open')
      const gone = await get(`8000-nosuchsandbox0000000.${domain}`)
      assert.equal(gone.status, 502)
      assert.equal(JSON.parse(gone.body).message, 'The sandbox was not found')
    } finally {
      await server.kill()
    }
  })

  test('private ports want the traffic token', T, async () => {
    const priv = await sandbox({ network: { allowPublicTraffic: false } })
    assert.ok(priv.trafficAccessToken)
    const server = await priv.commands.run('python3 -m http.server 8000', { background: true })
    try {
      const host = priv.getHost(8000)
      await waitUntil(async () => (await get(host, '/', { 'e2b-traffic-access-token': priv.trafficAccessToken })).status === 200,
        20_000, 'the private server with its token')
      const denied = await get(host)
      assert.equal(denied.status, 403)
      assert.match(JSON.parse(denied.body).message, /traffic access token/)
    } finally {
      await server.kill()
    }
  })
})
