package redisstore

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
)

// go-redis has one logger per process, and no way to read it. The store
// sets its own when the package loads, before any config: a plugin that
// sets its logger later (in its init or when provisioned) keeps it, and
// the store never sets it again. Only the lines of the store's own calls
// (their context is storeContext) or about its Redis addresses (a dial:
// go-redis dials without the call's context) go to Caddy's log, as logger
// `redis`; other clients' lines are written as go-redis's default logger
// writes them. The store logs its failures itself in any case (outages, with
// their reason).
func init() {
	redis.SetLogger(routedLogging{})
}

// storeCall marks the contexts of the store's Redis calls.
type storeCall struct{}

// storeContext is the root of every context the store calls Redis with.
var storeContext = context.WithValue(context.Background(), storeCall{}, true)

// storeAddresses holds every address a store was provisioned with.
var storeAddresses sync.Map

// ownLine reports whether a go-redis line is about the store's calls.
func ownLine(ctx context.Context, line string) bool {
	if ctx != nil && ctx.Value(storeCall{}) != nil {
		return true
	}
	own := false
	storeAddresses.Range(func(addr, _ any) bool {
		own = mentions(line, addr.(string))
		return !own
	})
	return own
}

// mentions reports whether line names addr, and not an address that
// begins or ends with it (port 4559 in 127.0.0.1:45595, 10.0.0.1:80 in
// 110.0.0.1:80, redis:6379 in myredis:6379).
func mentions(line, addr string) bool {
	for i := 0; ; i++ {
		j := strings.Index(line[i:], addr)
		if j < 0 {
			return false
		}
		i += j
		end := i + len(addr)
		if (i == 0 || !inHost(line[i-1])) && (end == len(line) || line[end] < '0' || line[end] > '9') {
			return true
		}
	}
}

// inHost reports whether c can be part of a host name or address.
func inHost(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '.' || c == '-' || c == '_'
}

// plainRedisLog writes as go-redis's default logger does.
var plainRedisLog = log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)

type routedLogging struct{}

// Printf logs the store's lines at warn level through the current default
// logger, which follows Caddy's logging config across reloads.
func (routedLogging) Printf(ctx context.Context, format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	if ownLine(ctx, line) {
		caddy.Log().Named("redis").Warn(line)
		return
	}
	plainRedisLog.Output(3, line) // the caller in go-redis, as its default does
}
