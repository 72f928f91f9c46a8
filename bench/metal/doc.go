// Package metalbench measures the bare-metal lifecycle at scale: machines
// commissioned by one simulated site agent (bctest.SimSite, Redfish BMC
// emulators on loopback) through the real API, provision engine and River
// jobs, on SQLite or, with BC_TEST_POSTGRES_URL, PostgreSQL.
//
//	go test ./bench/metal -run '^$' -bench Commission -benchtime 1x -machines 1000
//
// The figures are in docs/benchmarks.md.
package metalbench
