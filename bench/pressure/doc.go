// Package pressure is the KV-pressure report (bench/cmd/pressure, `make bench-pressure`): every strategy on
// a fleet whose engines hold only part of each workload's working set, so placement decides what stays
// cached. The method is written into the report itself (its "Setup" section); PlacementOracle is the
// bound a placement can reach.
package pressure
