//go:build !cgo

package fake

func open(opts Options) (*Backend, error) { return fromSnapshot(opts) }
