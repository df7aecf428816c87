package sandbox

import "context"

// ImagePeer is another host of the cluster that offers the image of a
// snapshot this host is to start a sandbox from (a fork child placed
// elsewhere than its parent: the gateway names the parent's host), before
// or besides the chunk store: the image's manifest Root and the host's
// Addr (host:port). Imports of that root read the peer first and the
// store after; what the peer sends is verified as the store's is.
type ImagePeer struct {
	Snapshot string // the snapshot (id or name) the create names
	Root     string
	Addr     string
}

type imagePeerKey struct{}

// WithImagePeer says the image of snapshot p.Snapshot is offered by p.
func WithImagePeer(ctx context.Context, p ImagePeer) context.Context {
	return context.WithValue(ctx, imagePeerKey{}, p)
}

// ImagePeerOf returns the peer WithImagePeer put in ctx.
func ImagePeerOf(ctx context.Context) (ImagePeer, bool) {
	p, ok := ctx.Value(imagePeerKey{}).(ImagePeer)
	return p, ok
}
