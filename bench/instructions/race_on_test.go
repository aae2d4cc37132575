//go:build race

package instructions

// raceEnabled: the tests run under the race detector.
const raceEnabled = true
