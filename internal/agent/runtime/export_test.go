package runtime

import "context"

// BootProbe exposes the accel probe to tests.
func BootProbe(r *Runtime, ctx context.Context, accel string) error { return r.bootProbe(ctx, accel) }
