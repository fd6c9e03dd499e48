package storestatus

// Health is a shared store's state, as the admin API shows it.
type Health struct {
	// Type is the store module's name, such as `redis`.
	Type string `json:"type"`
	// Reachable reports whether the store answered its latest operation.
	Reachable bool `json:"reachable"`
}

// Reporter is a zone's shared store that can tell its health.
type Reporter interface {
	Health() Health
}
