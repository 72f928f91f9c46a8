//go:build race

package app_test

// raceEnabled: built with the race detector, which slows every goroutine
// several times; scale tests move fewer nodes (the plain runs move all).
const raceEnabled = true
