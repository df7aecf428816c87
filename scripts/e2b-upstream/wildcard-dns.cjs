// Preloaded (node --require) for the E2B upstream measurement: resolves
// every name under $CELLFORK_WILDCARD_DOMAIN to 127.0.0.1, standing in for
// the wildcard DNS record of a --domain deployment (docs/setup.md). The TLS
// front's certificate is trusted through NODE_EXTRA_CA_CERTS. Test harness
// only.
const dns = require('node:dns')

const domain = (process.env.CELLFORK_WILDCARD_DOMAIN || '').toLowerCase().replace(/\.$/, '')
const lookup = dns.lookup
const promisesLookup = dns.promises.lookup

function matches(host) {
  const h = String(host).toLowerCase()
  return domain !== '' && (h === domain || h.endsWith('.' + domain))
}

dns.lookup = function (host, options, callback) {
  if (!matches(host)) return lookup.apply(this, arguments)
  if (typeof options === 'function') {
    callback = options
    options = {}
  }
  if (typeof options === 'number') options = { family: options }
  if (options && options.all) return process.nextTick(callback, null, [{ address: '127.0.0.1', family: 4 }])
  process.nextTick(callback, null, '127.0.0.1', 4)
}
dns.promises.lookup = async function (host, options) {
  if (!matches(host)) return promisesLookup.call(this, host, options)
  return options && options.all ? [{ address: '127.0.0.1', family: 4 }] : { address: '127.0.0.1', family: 4 }
}
