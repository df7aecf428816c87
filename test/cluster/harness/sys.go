package harness

import (
	"crypto/sha256"
	"encoding/hex"

	"golang.org/x/sys/unix"
)

func unmount(p string) error { return unix.Unmount(p, unix.MNT_DETACH) }

// hashPrefix is how a daemon names its networks: a hash of its data dir.
func hashPrefix(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return hex.EncodeToString(sum[:3])
}
