// Package templates embeds the definitions of the built-in templates: a
// Debian package list per template and the script that builds a rootfs from
// it. A template's rootfs is cached under its definition's hash, so editing
// a file here triggers a rebuild and nothing else does.
package templates

import "embed"

// FS holds build-rootfs.sh, <template>/packages and <template>/preimport
// (modules the warm image has imported, so the first run_code is instant).
//
//go:embed build-rootfs.sh base/packages base/preimport
var FS embed.FS
