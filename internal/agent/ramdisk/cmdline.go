package ramdisk

import (
	"errors"
	"strings"
)

// Kernel command line arguments the site's iPXE script passes the ramdisk.
const (
	// ArgToken carries the single-use discovery token.
	ArgToken = "bc.token"
	// ArgServer is the gateway's host:port.
	ArgServer = "bc.server"
	// ArgPin is the sha256 of the gateway's trust anchor (64 hex).
	ArgPin = "bc.pin"
	// ArgImages is the site's image cache URL (image.write's default
	// source).
	ArgImages = "bc.images"
)

// Boot is what the ramdisk reads from its kernel command line.
type Boot struct {
	Token  string
	Server string
	Pin    string
	Images string
}

// ParseCmdline reads the ramdisk's arguments from a kernel command line.
func ParseCmdline(cmdline string) (Boot, error) {
	var b Boot
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case ArgToken:
			b.Token = v
		case ArgServer:
			b.Server = v
		case ArgPin:
			b.Pin = v
		case ArgImages:
			b.Images = v
		}
	}
	if b.Token == "" || b.Server == "" {
		return b, errors.New("the kernel command line lacks " + ArgToken + " or " + ArgServer)
	}
	return b, nil
}

// redactCmdline hides the discovery token from collected logs.
func redactCmdline(s string) string {
	fs := strings.Fields(s)
	for i, f := range fs {
		if strings.HasPrefix(f, ArgToken+"=") {
			fs[i] = ArgToken + "=[redacted]"
		}
	}
	return strings.Join(fs, " ")
}
