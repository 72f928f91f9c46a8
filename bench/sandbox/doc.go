// Package sandboxbench measures sandboxes end to end through the public
// API: a warm claim until the guest runs a command, a cold boot until SSH
// answers, snapshot → restore → exec-ready, and N creates at once. By
// default the hosts are simulated (bctest.FleetSim, the fake hypervisor);
// with BC_GUEST=1 (root, make guest-image) the one host is a real bcd
// booting the guest image under QEMU (bctest.GuestRig, TCG here).
//
//	go test ./bench/sandbox -run '^$' -bench . -benchtime 20x
//	BC_GUEST=1 go test ./bench/sandbox -run '^$' -bench . -benchtime 2x -concurrent 2 -timeout 60m
//
// Each benchmark reports p50-ms and p99-ms (p99 is the largest sample
// below 100 samples). The figures are in docs/benchmarks.md.
package sandboxbench
