// Package devrig is `better-compute dev`'s rig: one process running every
// role on the state directory (its admin key shown once, its PKI sealed by
// a secret kept beside the database), with simulated GPU hosts (the test
// kit's FleetSim: the real agent code on go-nvml's mocks, joining over
// loopback mTLS) and simulated bare-metal machines (Redfish BMC emulators
// behind an in-process site agent), and the catalog dev seeds for them:
// tenant sim, pool h100, flavor small, IP pool dev, sandbox template
// default and the signed sample image.
//
// It is the one package outside the test kit that may import bctest: its
// simulated nodes are the product's dev mode. serve must never use it, and
// a seed must never overwrite what an operator changed: each looks before
// it creates, so a restart writes nothing.
package devrig
