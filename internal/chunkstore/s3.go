package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sync/errgroup"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// S3Config says how to reach an S3-compatible server. Empty fields are read
// from the environment (S3ConfigFromEnv's variables).
type S3Config struct {
	// Endpoint is the server's URL (http://127.0.0.1:7070) or host:port
	// (https then); empty for AWS (s3.amazonaws.com).
	Endpoint string
	Region   string // default us-east-1
	// AccessKey and SecretKey; both empty for anonymous requests.
	AccessKey string
	SecretKey string
	// VirtualHost addresses buckets as bucket.endpoint; the default is
	// path style (endpoint/bucket), which every local server answers.
	VirtualHost bool
	// Timeout bounds each request (default 30s).
	Timeout time.Duration
	// LockLease is how long a lock object stays valid unless renewed
	// (default 30s); its holder renews it every third of that.
	LockLease time.Duration
	// Parallel is how many existence checks (HEADs) run at once (default 32).
	Parallel int
	// NoCheck opens the store without checking that its bucket exists (a
	// daemon starting while the server does not answer).
	NoCheck bool
}

// S3ConfigFromEnv fills the empty fields of c from AWS_ENDPOINT_URL_S3 (or
// AWS_ENDPOINT_URL), AWS_REGION (or AWS_DEFAULT_REGION),
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
func S3ConfigFromEnv(c S3Config) S3Config {
	first := func(cur string, names ...string) string {
		if cur != "" {
			return cur
		}
		for _, n := range names {
			if v := os.Getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	c.Endpoint = first(c.Endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
	c.Region = first(c.Region, "AWS_REGION", "AWS_DEFAULT_REGION")
	c.AccessKey = first(c.AccessKey, "AWS_ACCESS_KEY_ID")
	c.SecretKey = first(c.SecretKey, "AWS_SECRET_ACCESS_KEY")
	return c
}

// S3Backend keeps objects in a bucket under a prefix. Safe for concurrent
// use.
type S3Backend struct {
	c      *minio.Client
	bucket string
	prefix string // "" or ending in "/"
	cfg    S3Config
	name   string
}

// OpenS3 opens the store at s3://bucket/prefix. It checks that the bucket
// exists (ErrUnavailable if the server does not answer, ErrNotFound if
// there is no such bucket).
func OpenS3(ctx context.Context, bucket, prefix string, cfg S3Config) (*S3Backend, error) {
	cfg = S3ConfigFromEnv(cfg)
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.LockLease <= 0 {
		cfg.LockLease = 30 * time.Second
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 32
	}
	if bucket == "" {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "s3 store: no bucket (want s3://bucket/prefix)")
	}
	host, secure := "s3.amazonaws.com", true
	if cfg.Endpoint != "" {
		if u, err := url.Parse(cfg.Endpoint); err == nil && u.Host != "" {
			host, secure = u.Host, u.Scheme == "https"
		} else {
			host = cfg.Endpoint
		}
	}
	var creds *credentials.Credentials
	if cfg.AccessKey != "" || cfg.SecretKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	} else {
		creds = credentials.New(&credentials.Static{Value: credentials.Value{SignerType: credentials.SignatureAnonymous}})
	}
	lookup := minio.BucketLookupPath
	if cfg.VirtualHost {
		lookup = minio.BucketLookupDNS
	}
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	tr.MaxIdleConnsPerHost = 64
	c, err := minio.New(host, &minio.Options{
		Creds: creds, Secure: secure, Region: cfg.Region, BucketLookup: lookup, Transport: tr,
		MaxRetries: 1, // ours retry (Retry), with one policy for every backend
	})
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "s3 store %s: %v", host, err)
	}
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	b := &S3Backend{c: c, bucket: bucket, prefix: prefix, cfg: cfg, name: "s3://" + bucket + "/" + prefix + " at " + host}
	if cfg.NoCheck {
		return b, nil
	}
	err = DefaultRetry.do(ctx, func() error {
		rctx, cancel := b.reqCtx(ctx)
		defer cancel()
		ok, err := c.BucketExists(rctx, bucket)
		if err != nil {
			return s3Err("opening", bucket, err)
		}
		if !ok {
			return errdefs.New(errdefs.ErrNotFound, "s3 store: no bucket %q at %s", bucket, host)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

func (b *S3Backend) String() string { return b.name }

func (b *S3Backend) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.cfg.Timeout)
}

// s3Err classifies a client error.
func s3Err(op, key string, err error) error {
	if err == nil {
		return nil
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		switch {
		case resp.Code == "NoSuchKey" || resp.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%s %s: %s: %w", op, key, resp.Code, errdefs.ErrNotFound)
		case resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized:
			return fmt.Errorf("%s %s: %s: %w", op, key, resp.Message, errdefs.ErrPermissionDenied)
		case resp.Code == "ExistingObjectIsDirectory":
			// Our keys never name a directory: a server that keeps
			// objects as files (versitygw's posix backend) says this
			// when a delete removed the object's emptied parent
			// directory while this put placed it there. Again works.
			return fmt.Errorf("%s %s: %s %s: %w", op, key, resp.Code, resp.Message, errdefs.ErrUnavailable)
		case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.Code == "SlowDown" || resp.StatusCode == 0:
			return fmt.Errorf("%s %s: %s %s: %w", op, key, resp.Code, resp.Message, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("%s %s: %s %s (HTTP %d)", op, key, resp.Code, resp.Message, resp.StatusCode)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	// Everything else is the connection: refused, reset, timed out, cut
	// short.
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: the store does not answer: %v: %w", op, key, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s %s: %v: %w", op, key, err, errdefs.ErrUnavailable)
}

func (b *S3Backend) Get(ctx context.Context, key string) ([]byte, error) {
	rctx, cancel := b.reqCtx(ctx)
	defer cancel()
	obj, err := b.c.GetObject(rctx, b.bucket, b.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s3Err("reading", key, err)
	}
	defer obj.Close()
	data, err := io.ReadAll(obj)
	if err != nil {
		return nil, s3Err("reading", key, err)
	}
	return data, nil
}

func (b *S3Backend) Put(ctx context.Context, key string, data []byte) error {
	rctx, cancel := b.reqCtx(ctx)
	defer cancel()
	// Unsigned payload: the chunk's own hash checks it end to end, and
	// signing would hash every byte again with SHA-256.
	_, err := b.c.PutObject(rctx, b.bucket, b.prefix+key, bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{ContentType: "application/octet-stream", DisableContentSha256: true})
	return s3Err("writing", key, err)
}

// Has asks for each key with a HEAD, cfg.Parallel at a time.
func (b *S3Backend) Has(ctx context.Context, keys []string) ([]bool, error) {
	found := make([]bool, len(keys))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(b.cfg.Parallel)
	for i, k := range keys {
		g.Go(func() error {
			rctx, cancel := b.reqCtx(gctx)
			defer cancel()
			_, err := b.c.StatObject(rctx, b.bucket, b.prefix+k, minio.StatObjectOptions{})
			err = s3Err("looking up", k, err)
			switch {
			case err == nil:
				found[i] = true
			case !isNotFound(err):
				return err
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return found, nil
}

func (b *S3Backend) Delete(ctx context.Context, key string) error {
	rctx, cancel := b.reqCtx(ctx)
	defer cancel()
	err := s3Err("deleting", key, b.c.RemoveObject(rctx, b.bucket, b.prefix+key, minio.RemoveObjectOptions{}))
	if isNotFound(err) {
		return nil
	}
	return err
}

func (b *S3Backend) List(ctx context.Context, prefix string, fn func(Object) error) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for o := range b.c.ListObjects(lctx, b.bucket, minio.ListObjectsOptions{Prefix: b.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return s3Err("listing", prefix, o.Err)
		}
		if err := fn(Object{Key: strings.TrimPrefix(o.Key, b.prefix), Size: o.Size, Modified: o.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Flush is a no-op: an S3 PUT is durable when it returns.
func (b *S3Backend) Flush(ctx context.Context) error { return nil }

// GetRange reads n bytes of the object from off with a ranged GET (fewer
// at its end; none past it).
func (b *S3Backend) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	rctx, cancel := b.reqCtx(ctx)
	defer cancel()
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(off, off+n-1); err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "reading %s: range %d+%d: %v", key, off, n, err)
	}
	obj, err := b.c.GetObject(rctx, b.bucket, b.prefix+key, opts)
	if err != nil {
		return nil, s3Err("reading", key, err)
	}
	defer obj.Close()
	data, err := io.ReadAll(obj)
	if err != nil {
		var resp minio.ErrorResponse
		if errors.As(err, &resp) && resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
			return nil, nil // the object ends before off
		}
		return nil, s3Err("reading", key, err)
	}
	return data, nil
}
