package metrics

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Gateway is the cluster gateway's metrics, registered on the gateway's
// registry. A nil *Gateway counts nothing. Safe for concurrent use.
type Gateway struct {
	route        *prometheus.HistogramVec
	requests     *prometheus.CounterVec
	authFailures *prometheus.CounterVec

	mu    sync.Mutex
	hosts func() map[[2]string]int // guarded by mu
}

// NewGateway registers the gateway's metrics on reg. A gateway serving in
// the same process as a daemon registers on the daemon's registry
// (Host.Registry) and shares its cellfork_auth_failures_total.
func NewGateway(reg prometheus.Registerer) *Gateway {
	g := &Gateway{
		route:        defGatewayRoute.histogram(LatencyBuckets),
		requests:     defGatewayRequests.counter(),
		authFailures: defAuthFailures.counter(),
	}
	reg.MustRegister(g.route, g.requests, gatewayHosts{g})
	if err := reg.Register(g.authFailures); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err)
		}
		g.authFailures = are.ExistingCollector.(*prometheus.CounterVec)
	}
	return g
}

// NewGatewayRegistry returns a registry with the Go runtime's and the
// process's metrics and the gateway's, for a gateway's own /metrics.
func NewGatewayRegistry(version string) (*prometheus.Registry, *Gateway) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectorsFor(version)...)
	return reg, NewGateway(reg)
}

// Handler serves reg's metrics in Prometheus's text format (or
// OpenMetrics, when the scraper asks).
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true, MaxRequestsInFlight: 4, Timeout: 10 * time.Second})
}

// Routed records how long routing a request of plane (control, data) to
// its host took, and how it ended (ok, no_host, unreachable).
func (g *Gateway) Routed(plane, outcome string, d time.Duration) {
	if g != nil {
		g.route.WithLabelValues(plane, outcome).Observe(d.Seconds())
	}
}

// Answered counts a request the gateway answered.
func (g *Gateway) Answered(plane string, code int) {
	if g != nil {
		g.requests.WithLabelValues(plane, strconv.Itoa(code)).Inc()
	}
}

// AuthFailure counts a request refused for authentication.
func (g *Gateway) AuthFailure(reason string) {
	if g != nil {
		g.authFailures.WithLabelValues(reason).Inc()
	}
}

// SetHosts makes f, called at each scrape, the source of
// cellfork_gateway_hosts: host counts by {region, state}.
func (g *Gateway) SetHosts(f func() map[[2]string]int) {
	if g != nil {
		g.mu.Lock()
		g.hosts = f
		g.mu.Unlock()
	}
}

// gatewayHosts collects cellfork_gateway_hosts from the gateway's source.
type gatewayHosts struct{ g *Gateway }

var gatewayHostsDesc = defGatewayHosts.desc()

func (c gatewayHosts) Describe(ch chan<- *prometheus.Desc) { ch <- gatewayHostsDesc }

func (c gatewayHosts) Collect(ch chan<- prometheus.Metric) {
	c.g.mu.Lock()
	f := c.g.hosts
	c.g.mu.Unlock()
	if f == nil {
		return
	}
	for k, n := range f() {
		ch <- prometheus.MustNewConstMetric(gatewayHostsDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}
