//go:build !race

package app_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
