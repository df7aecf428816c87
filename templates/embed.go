// Package templates embeds the definitions of the built-in templates: a
// Debian package list per template and the script that builds a rootfs from
// it. A template's rootfs is cached under its definition's hash, so editing
// a file here triggers a rebuild and nothing else does.
package templates

import "embed"

// FS holds build-rootfs.sh and <template>/packages.
//
//go:embed build-rootfs.sh base/packages
var FS embed.FS
