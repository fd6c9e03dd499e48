package redisstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
)

var routeOnce sync.Once

// routeRedisLog sends go-redis's own log lines (connection pool, failed
// dials) to Caddy's log as logger `redis`, instead of plain text on
// stderr. go-redis has one logger per process.
func routeRedisLog() {
	routeOnce.Do(func() { redis.SetLogger(zapLogging{}) })
}

type zapLogging struct{}

// Printf logs at warn level through the current default logger, which
// follows Caddy's logging config across reloads.
func (zapLogging) Printf(_ context.Context, format string, v ...any) {
	caddy.Log().Named("redis").Warn(fmt.Sprintf(format, v...))
}
