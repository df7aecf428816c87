// Package telemetry is cellfork's OpenTelemetry tracing: a span per HTTP
// request (continuing the caller's W3C traceparent) and a child span per
// phase of its Server-Timing (through timing.Tracer), exported over OTLP.
// It is off unless turned on; the standard OTEL_* environment variables
// configure the exporter, sampler and resource.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/cellfork/cellfork/internal/timing"
)

// Config turns tracing on and names the service.
type Config struct {
	// Enabled turns tracing on (--tracing). OTEL_TRACES_EXPORTER=otlp also
	// does; OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true keep it off.
	Enabled bool
	Service string // default service.name; OTEL_SERVICE_NAME wins
	Version string
	// Exporter replaces the OTLP exporter (tests: an in-memory one).
	Exporter sdktrace.SpanExporter
}

// On reports whether cfg and the environment turn tracing on.
func (c Config) On() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return c.Enabled || c.Exporter != nil
}

// Tracing exports spans. A nil *Tracing traces nothing, so callers need
// not check. Safe for concurrent use.
type Tracing struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// New returns the tracing cfg asks for, or nil when it is off.
func New(ctx context.Context, cfg Config) (*Tracing, error) {
	if !cfg.On() {
		return nil, nil
	}
	exp := cfg.Exporter
	if exp == nil {
		proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if proto == "" {
			proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		if proto != "" && proto != "http/protobuf" {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: cellfork exports traces over http/protobuf only (the collector's port 4318)", proto)
		}
		var err error
		if exp, err = otlptracehttp.New(ctx); err != nil {
			return nil, fmt.Errorf("starting the OTLP trace exporter: %w", err)
		}
	}
	service := cfg.Service
	if service == "" {
		service = "cellfork"
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the defaults.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service), semconv.ServiceVersion(cfg.Version)),
		resource.WithHost(), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("describing the trace resource: %w", err)
	}
	// The sampler is the SDK's default (parent-based, always on), or what
	// OTEL_TRACES_SAMPLER says; OTEL_BSP_* tune the batching.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{
		tp:     tp,
		tracer: tp.Tracer("github.com/cellfork/cellfork"),
		prop:   propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}, nil
}

// Shutdown exports what is buffered and stops.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// Request is the span of one HTTP request. A nil *Request does nothing.
type Request struct {
	span trace.Span
}

// StartRequest starts the server span of r, continuing the trace of its
// traceparent header if it has one. Name it with Finish once routed.
func (t *Tracing) StartRequest(r *http.Request) (context.Context, *Request) {
	if t == nil {
		return r.Context(), nil
	}
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := t.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path)))
	return ctx, &Request{span: span}
}

// Finish names the span after the route that served it ("POST
// /sandboxes/{id}/fork", or the data plane's "POST /execute"), records
// the outcome and ends it.
func (q *Request) Finish(route, operation, sandboxID string, status int) {
	if q == nil {
		return
	}
	if route != "" {
		q.span.SetName(route)
		q.span.SetAttributes(semconv.HTTPRoute(route))
	}
	q.span.SetAttributes(semconv.HTTPResponseStatusCode(status), attribute.String("cellfork.operation", operation))
	if sandboxID != "" {
		q.span.SetAttributes(attribute.String("cellfork.sandbox.id", sandboxID))
	}
	if status >= 500 {
		q.span.SetStatus(codes.Error, http.StatusText(status))
	}
	q.span.End()
}

// Phases returns the timing.Tracer that makes each phase a child span of
// the request's, or nil when tracing is off.
func (t *Tracing) Phases() timing.Tracer {
	if t == nil {
		return nil
	}
	return phases{t}
}

type phases struct{ t *Tracing }

func (p phases) Phase(ctx context.Context, name string, start, end time.Time) {
	_, span := p.t.tracer.Start(ctx, name, trace.WithTimestamp(start))
	span.End(trace.WithTimestamp(end))
}

func (p phases) Start(ctx context.Context, name string) (context.Context, func()) {
	ctx, span := p.t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient))
	return ctx, func() { span.End() }
}

func (p phases) Inject(ctx context.Context, h http.Header) {
	p.t.prop.Inject(ctx, propagation.HeaderCarrier(h))
}
