// Egress rules (E2B's request transforms: headers injected into a
// sandbox's requests to a named host) and maskRequestHost, through the
// official e2b package. What a ruled host receives is proven against a
// fake internet in the Go suite (test/integration/rules_test.go); this
// daemon has no such host, so here: what the SDK sees back (values
// redacted), what the sandbox holds (the egress CA, never the secret), the
// update that replaces the rules, refusals, and the Host a masked port's
// server receives.
import assert from 'node:assert/strict'
import { describe, test } from 'node:test'

import { SandboxError } from 'e2b'

import { env, sandbox, waitUntil } from './helpers.mjs'

const T = { timeout: 60_000 }
const SECRET = 'Bearer sk-conformance-js-8f2a6d41c3'
const REDACTED = '[redacted]'
const BUNDLE = '/etc/ssl/certs/ca-certificates.crt'

function rules(value = SECRET) {
  return {
    'api.example.com': [{ transform: { headers: { Authorization: value, 'X-Team': 't' } } }],
    '*.example.org': [{ transform: { headers: { 'X-Wild': 'w' } } }],
  }
}

// assertSecretAbsent checks that the secret is in no process's environment
// and no file of the sandbox (the grep pattern ends in "." so that grep's
// own arguments are not the secret).
async function assertSecretAbsent(sbx) {
  const envs = await sbx.commands.run("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
  assert.ok(!envs.stdout.includes(SECRET), 'the secret is in an environment')
  const files = await sbx.commands.run(
    `grep -rIl -e '${SECRET.slice(0, -1)}.' /etc /home /root /tmp /run /var /usr/local /opt 2>/dev/null; true`,
    { user: 'root' })
  assert.equal(files.stdout.trim(), '', `files holding the secret: ${files.stdout}`)
}

// caCount returns how many times the daemon's egress CA is in the bundle.
async function caCount(sbx) {
  return (await sbx.commands.run(`grep -c 'cellfork egress CA' ${BUNDLE} || true`)).stdout.trim()
}

// refused asserts that creating a sandbox with network is a 400.
async function refused(network, what) {
  await assert.rejects(sandbox({ network }), (e) => {
    assert.ok(e instanceof SandboxError, `${what}: ${e}`)
    assert.match(e.message, /^400: /, what)
    return true
  }, what)
}

describe('rules', () => {
  test('at create: reported redacted, the CA trusted, the secret nowhere inside', T, async () => {
    const sbx = await sandbox({ network: { rules: rules() } })
    assert.deepEqual((await sbx.getInfo()).network.rules, {
      'api.example.com': [{ transform: { headers: { Authorization: REDACTED, 'X-Team': REDACTED } } }],
      '*.example.org': [{ transform: { headers: { 'X-Wild': REDACTED } } }],
    })
    assert.equal(await caCount(sbx), '1')
    const envs = (await sbx.commands.run('env')).stdout
    for (const v of ['SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE']) assert.ok(envs.includes(`${v}=${BUNDLE}`), v)
    assert.ok(envs.includes('NODE_EXTRA_CA_CERTS=/usr/local/share/ca-certificates/cellfork-egress-ca.crt'), envs)
    await assertSecretAbsent(sbx)
  })

  test('a Map of rules, and allowOut from the rules\' hosts', T, async () => {
    const sbx = await sandbox({
      network: {
        rules: new Map([['api.example.com', [{ transform: { headers: { Authorization: SECRET } } }]]]),
        allowOut: ({ rules: r }) => [...r.keys()],
        denyOut: ({ allTraffic }) => [allTraffic],
      },
    })
    const net = (await sbx.getInfo()).network
    assert.deepEqual(net.allowOut, ['api.example.com'])
    assert.deepEqual(net.denyOut, ['0.0.0.0/0'])
    assert.deepEqual(net.rules, { 'api.example.com': [{ transform: { headers: { Authorization: REDACTED } } }] })
    await assertSecretAbsent(sbx)
  })

  test('by update, which replaces them ({} clears)', T, async () => {
    const sbx = await sandbox()
    assert.equal((await sbx.getInfo()).network?.rules, undefined)
    await sbx.updateNetwork({ rules: { 'API.Example.com': [{ transform: { headers: { Authorization: SECRET } } }] } })
    assert.deepEqual((await sbx.getInfo()).network.rules,
      { 'api.example.com': [{ transform: { headers: { Authorization: REDACTED } } }] }, 'keys are lowercased')
    assert.equal(await caCount(sbx), '1')
    await assertSecretAbsent(sbx)
    await sbx.updateNetwork({})
    assert.equal((await sbx.getInfo()).network.rules, undefined)
  })

  test('bad rules are refused', T, async () => {
    const cases = {
      // E2B's secret store and workload identity: cellfork has neither.
      'a secret reference': { 'api.example.com': [{ transform: { headers: { Authorization: 'Bearer ${e2b.secrets.OPENAI_KEY}' } } }] },
      'an identity token': { 'api.example.com': [{ transform: { headers: { Authorization: '${e2b.identity.tokens.aws}' } } }] },
      'the redaction marker sent back': { 'api.example.com': [{ transform: { headers: { Authorization: REDACTED } } }] },
      'two rules for a domain': { 'api.example.com': [{}, {}] },
      'not a domain': { 'not a domain': [] },
      'a framing header': { 'api.example.com': [{ transform: { headers: { 'Content-Length': '1' } } }] },
    }
    for (const [what, r] of Object.entries(cases)) await refused({ rules: r }, what)
  })
})

const MASK = '${PORT}-masked.example.com'
const HOST_SERVER = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get("Host", "") + "|" + self.headers.get("X-Forwarded-Host", "")).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

describe('maskRequestHost', () => {
  test('a port\'s server receives the masked Host', T, async () => {
    const sbx = await sandbox({ network: { maskRequestHost: MASK } })
    assert.equal((await sbx.getInfo()).network.maskRequestHost, MASK)
    await sbx.files.write('/tmp/host.py', HOST_SERVER)
    await sbx.commands.run('python3 /tmp/host.py', { background: true })
    const base = env().sandboxUrl
    const body = await waitUntil(async () => {
      const res = await fetch(base, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } })
      return res.status === 200 && res.text()
    }, 20_000, 'the server in the sandbox')
    const [host, forwarded] = body.split('|')
    assert.equal(host, '8000-masked.example.com')
    assert.equal(forwarded, new URL(base).host)
    // Ingress is the create's: an update of the egress keeps the mask.
    await sbx.updateNetwork({})
    assert.equal((await sbx.getInfo()).network.maskRequestHost, MASK)
  })

  test('bad masks are refused', T, async () => {
    for (const mask of ['has space.example.com', 'a.example.com/path', 'bücher.example']) {
      await refused({ maskRequestHost: mask }, mask)
    }
  })
})
