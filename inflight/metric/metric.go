// Package metric declares the module's Prometheus metric families, all in
// one way: the family's full name, as Prometheus shows it, so that a
// search for a metric's name finds its declaration; its help text; and its
// label names. The collectors are made once per process, so their values
// outlive reloads, and registered in every config's registry.
package metric

import "github.com/prometheus/client_golang/prometheus"

// Counter declares a counter family.
func Counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Gauge declares a gauge family.
func Gauge(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// Histogram declares a histogram family with the given bucket bounds.
func Histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}
