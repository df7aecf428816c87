package metrics

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Gateway is the cluster gateway's metrics, registered on the gateway's
// registry. Safe for concurrent use.
type Gateway struct {
	route        *prometheus.HistogramVec
	requests     *prometheus.CounterVec
	hosts        *prometheus.GaugeVec
	authFailures *prometheus.CounterVec
}

// NewGateway registers the gateway's metrics on reg. A gateway serving in
// the same process as a daemon registers on the daemon's registry
// (Host.Registry) and shares its cellfork_auth_failures_total.
func NewGateway(reg prometheus.Registerer) *Gateway {
	g := &Gateway{
		route:        defGatewayRoute.histogram(LatencyBuckets),
		requests:     defGatewayRequests.counter(),
		hosts:        defGatewayHosts.gauge(),
		authFailures: defAuthFailures.counter(),
	}
	reg.MustRegister(g.route, g.requests, g.hosts)
	if err := reg.Register(g.authFailures); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err)
		}
		g.authFailures = are.ExistingCollector.(*prometheus.CounterVec)
	}
	return g
}

// Routed records how long routing a request of plane (control, data) to
// its host took, and how it ended (ok, no_host, unreachable).
func (g *Gateway) Routed(plane, outcome string, d time.Duration) {
	g.route.WithLabelValues(plane, outcome).Observe(d.Seconds())
}

// Answered counts a request the gateway answered.
func (g *Gateway) Answered(plane string, code int) {
	g.requests.WithLabelValues(plane, strconv.Itoa(code)).Inc()
}

// Hosts sets how many hosts of region are in state.
func (g *Gateway) Hosts(region, state string, n int) {
	g.hosts.WithLabelValues(region, state).Set(float64(n))
}

// AuthFailure counts a request refused for authentication.
func (g *Gateway) AuthFailure(reason string) { g.authFailures.WithLabelValues(reason).Inc() }
