// Package scaleout is the scale-out report (bench/cmd/scaleout, `make bench-scaleout`): N `rolter serve`
// processes behind HAProxy in TCP mode, balancing connections round robin as a Kubernetes Service does, in
// front of one simulated fleet. Each replica learns only from the traffic it sees, so what one gateway's
// routing achieves and what N of them achieve can be compared cell by cell.
package scaleout
