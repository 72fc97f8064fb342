//go:build !race

package debuginfo

const raceEnabled = false
