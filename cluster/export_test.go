package cluster

import "io"

// WriteMetrics writes the cluster's series in the Prometheus text format, as /metrics shows them.
func (c *Cluster) WriteMetrics(w io.Writer) { c.set.Inner().WritePrometheus(w) }
