package redisstore

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

func init() {
	caddy.RegisterModule(new(Store))
}

// Store keeps a zone's counts in Redis, so that one cap holds across a
// fleet of Caddy instances. Each slot held is a lease: a member of a sorted
// set per key, scored by its expiry. Admission is one atomic script (drop
// expired leases, check every limit, add the lease to all, or to none);
// release removes the lease. Requests that outlive half their lease have it
// renewed, by one timer per instance for all of them, so a crashed
// instance's slots come back within `lease`.
type Store struct {
	// Address lists the Redis servers: one address for a single server,
	// several for a cluster, or the sentinels with MasterName.
	Address []string `json:"address,omitempty"`

	// MasterName is the Sentinel master's name, when Address lists
	// sentinels.
	MasterName string `json:"master_name,omitempty"`

	// Username and Password authenticate to Redis (placeholders such as
	// `{env.REDIS_PASSWORD}` are replaced at load).
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`

	// DB is the database number of a single server or sentinel setup.
	DB int `json:"db,omitempty"`

	// SentinelUsername and SentinelPassword authenticate to the sentinels,
	// when they require it (placeholders are replaced at load).
	SentinelUsername string `json:"sentinel_username,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`

	// Cluster makes a single address a Redis Cluster's configuration
	// endpoint (such as AWS ElastiCache's or MemoryDB's), not one server.
	// Several addresses always mean a cluster.
	Cluster bool `json:"cluster,omitempty"`

	// TLS connects to Redis, and to the sentinels, over TLS.
	TLS *TLS `json:"tls,omitempty"`

	// Lease is how long a held slot lives without renewal: the time a
	// crashed instance's slots stay taken. Default: 30s.
	Lease caddy.Duration `json:"lease,omitempty"`

	// OnError says what happens when Redis cannot be reached: `open` (the
	// default) admits, enforcing the caps in this instance only (divided by
	// the handler's `replicas`); `closed` refuses with the handler's status
	// (reason `store_error`).
	OnError string `json:"on_error,omitempty"`

	// Timeout bounds every Redis operation, so that no request waits longer
	// for Redis. Default: 250ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// KeyPrefix starts every Redis key and channel. Default: `inflight`.
	KeyPrefix string `json:"key_prefix,omitempty"`

	logger    *zap.Logger
	tlsConfig *tls.Config
	book      *book
	// warnings are those of its Caddyfile block (CaddyfileWarnings).
	warnings []caddyconfig.Warning
	// emptyPasswords names the passwords written as placeholders that
	// resolved to nothing, as written ("password {env.REDIS_PASSWORD}").
	emptyPasswords []string
}

// CaddyModule returns the Caddy module information.
func (*Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.inflight.stores.redis",
		New: func() caddy.Module { return new(Store) },
	}
}

// Provision sets defaults and connects, sharing one client, lease book and
// subscription among every handler (and config generation) that names the
// same Redis.
func (s *Store) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	repl := caddy.NewReplacer()
	s.replacePlaceholders(repl)
	if len(s.Address) == 0 {
		s.Address = []string{defaultAddress}
		s.logger.Warn("store redis names no address: using Redis's default, "+defaultAddress+"; the fleet shares one cap only if every instance reaches the same Redis there",
			zap.String("address", defaultAddress))
	}
	if s.Lease == 0 {
		s.Lease = caddy.Duration(30 * time.Second)
	}
	if s.Timeout == 0 {
		s.Timeout = caddy.Duration(250 * time.Millisecond)
	}
	if s.OnError == "" {
		s.OnError = "open"
	}
	if s.KeyPrefix == "" {
		s.KeyPrefix = "inflight"
	}
	if err := s.Validate(); err != nil {
		return err
	}
	for _, a := range s.Address {
		storeAddresses.Store(a, true)
	}
	var material []byte
	if s.TLS != nil {
		var err error
		if s.tlsConfig, material, err = s.TLS.config(repl); err != nil {
			return err
		}
	}
	raw, _ := json.Marshal(s)
	sum := sha256.Sum256(append(raw, material...))
	s.book = joinBook(s, hex.EncodeToString(sum[:]))
	s.checkAtStart()
	return nil
}

// replacePlaceholders replaces the placeholders of the addresses and
// credentials, and notes each password whose placeholders resolved to
// nothing (an unset {env.REDIS_PASSWORD}): Redis then gets no password,
// and the failure's reason names the placeholder (see failure).
func (s *Store) replacePlaceholders(repl *caddy.Replacer) {
	for i := range s.Address {
		s.Address[i] = repl.ReplaceAll(s.Address[i], "")
	}
	s.Username, s.SentinelUsername = repl.ReplaceAll(s.Username, ""), repl.ReplaceAll(s.SentinelUsername, "")
	s.emptyPasswords = nil
	for _, p := range []struct {
		option string
		value  *string
	}{{"password", &s.Password}, {"sentinel_password", &s.SentinelPassword}} {
		written := *p.value
		*p.value = repl.ReplaceAll(written, "")
		if written != "" && *p.value == "" { // all placeholders: no secret shown
			s.emptyPasswords = append(s.emptyPasswords, p.option+" "+written)
		}
	}
}

// defaultAddress is where the store looks for Redis when no address is
// given: Redis's own default.
const defaultAddress = "127.0.0.1:6379"

// redisOptions are go-redis's options for the store's settings.
func (s *Store) redisOptions() *redis.UniversalOptions {
	timeout := time.Duration(s.Timeout)
	opts := &redis.UniversalOptions{
		Addrs:            s.Address,
		IsClusterMode:    s.Cluster,
		MasterName:       s.MasterName,
		SentinelUsername: s.SentinelUsername,
		SentinelPassword: s.SentinelPassword,
		Username:         s.Username,
		Password:         s.Password,
		DB:               s.DB,
		TLSConfig:        s.tlsConfig,
		DialTimeout:      timeout,
		ReadTimeout:      timeout,
		WriteTimeout:     timeout,
		PoolTimeout:      timeout,
		MaxRetries:       -1, // a retry would double the wait; the caller falls back instead
		// RESP2: the store needs nothing of RESP3, and go-redis then
		// drops an idle connection with unread bytes instead of reading
		// them (with checkedTLS, a read that could block).
		Protocol: 2,
	}
	opts.Dialer = dialer(s.tlsConfig, timeout) // see dial.go: go-redis's dial breaker
	return opts
}

// Validate checks the settings.
func (s *Store) Validate() error {
	if err := checkLease(s.Lease); err != nil {
		return err
	}
	switch {
	case s.Timeout <= 0:
		return fmt.Errorf("inflight: store redis: timeout %s is not allowed: want a positive duration", time.Duration(s.Timeout))
	case s.DB < 0:
		return fmt.Errorf("inflight: store redis: db %d is not allowed: want a database number, 0 or more", s.DB)
	}
	// The checks the Caddyfile parser also makes, at each option's line.
	return cmp.Or(checkOnError(s.OnError), checkAddresses(s.Address), checkKeyPrefix(s.KeyPrefix), s.checkTopology())
}

// checkTopology refuses settings that do not go together: go-redis would
// ignore one of them.
func (s *Store) checkTopology() error {
	switch {
	case s.DB != 0 && s.MasterName == "" && (s.Cluster || len(s.Address) > 1):
		// A cluster has database 0 only.
		return fmt.Errorf("inflight: store redis: db %d is not allowed with a cluster: want 0 (a Redis Cluster has only database 0)", s.DB)
	case (s.SentinelUsername != "" || s.SentinelPassword != "") && s.MasterName == "":
		// go-redis would drop them and take the address for Redis itself.
		return errors.New("inflight: store redis: sentinel_username and sentinel_password are not allowed without master_name: want master_name with the sentinels' addresses")
	case s.Cluster && s.MasterName != "":
		return fmt.Errorf("inflight: store redis: cluster with master_name %q is not allowed: want a cluster or sentinels", s.MasterName)
	}
	return nil
}

// minLease is the shortest lease: renewals come at half of it.
const minLease = caddy.Duration(time.Second)

// checkLease refuses a lease shorter than minLease.
func checkLease(d caddy.Duration) error {
	if d < minLease {
		return fmt.Errorf("inflight: store redis: lease %s is not allowed: want at least %s, such as 30s", time.Duration(d), time.Duration(minLease))
	}
	return nil
}

// checkOnError refuses an on_error that is neither open nor closed.
func checkOnError(v string) error {
	if v != "open" && v != "closed" {
		return fmt.Errorf("inflight: store redis: on_error %q is not allowed: want open or closed", v)
	}
	return nil
}

// checkKeyPrefix refuses a brace, which would change the Redis Cluster hash
// tag that keeps a zone's keys in one slot.
func checkKeyPrefix(v string) error {
	if strings.ContainsAny(v, "{}") {
		return fmt.Errorf("inflight: store redis: key_prefix %q is not allowed: want no '{' or '}'", v)
	}
	return nil
}

// checkAddresses refuses the first address that is not host:port with a
// port number.
func checkAddresses(addrs []string) error {
	for _, a := range addrs {
		_, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 {
			return fmt.Errorf("inflight: store redis: address %q is not allowed: want host:port, such as 127.0.0.1:6379", a)
		}
	}
	return nil
}

// Cleanup drops this config's use of the shared client; it closes once no
// config, lease or waiter needs it.
func (s *Store) Cleanup() error {
	if s.book != nil {
		s.book.leave()
		s.book = nil
	}
	return nil
}

// Ledger returns the ledger of the zone id names, on the setup's client.
func (s *Store) Ledger(id string) limiter.Ledger { return s.book.ledger(id) }

// UnmarshalCaddyfile reads the store's block:
//
//	store redis {
//		address     <host:port>...   # one server, a cluster, or sentinels
//		cluster                      # one address: a cluster's configuration endpoint
//		master_name <name>           # with sentinels
//		sentinel_username <user>
//		sentinel_password <password>
//		username    <user>
//		password    <password>
//		db          <n>
//		tls                          # TLS, with the system's roots
//		tls_ca      <pem_file>       # TLS, trusting these CAs
//		tls_server_name <name>
//		tls_client_auth <cert_file> <key_file>
//		lease       <duration>       # 30s
//		on_error    open|closed      # open
//		timeout     <duration>       # 250ms
//		key_prefix  <prefix>         # inflight
//	}
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the store's name
	for d.NextBlock(0) {
		opt := d.Val()
		args := d.RemainingArgs()
		want, known := optionArgs(opt)
		switch {
		case !known:
			names := make([]string, len(options))
			for i, o := range options {
				names[i] = o.name
			}
			return d.Errf("inflight: store redis: unknown option %q: want one of %s", opt, strings.Join(names, ", "))
		case want == oneOrMore && len(args) == 0, want != oneOrMore && len(args) != want:
			if secretOptions[opt] {
				return d.Errf("inflight: store redis: %s has %d arguments (not shown: a secret): want %s", opt, len(args), argsWanted[want])
			}
			return d.Errf("inflight: store redis: %s %q: want %s", opt, args, argsWanted[want])
		}
		var err error
		switch opt {
		case "address":
			if err := checkAddresses(args); err != nil {
				return d.WrapErr(err)
			}
			s.Address = append(s.Address, args...)
		case "cluster":
			s.Cluster = true
		case "master_name":
			s.MasterName = args[0]
		case "sentinel_username":
			s.SentinelUsername = args[0]
		case "sentinel_password":
			s.SentinelPassword = args[0]
			s.warnLiteral(d, opt, args[0])
		case "username":
			s.Username = args[0]
		case "password":
			s.Password = args[0]
			s.warnLiteral(d, opt, args[0])
		case "db":
			s.DB, err = strconv.Atoi(args[0])
			if err != nil || s.DB < 0 {
				return d.Errf("inflight: store redis: db %q is not allowed: want a database number, 0 or more", args[0])
			}
		case "tls":
			s.tlsOptions()
		case "tls_ca":
			s.tlsOptions().CA = args[0]
		case "tls_server_name":
			s.tlsOptions().ServerName = args[0]
		case "tls_client_auth":
			s.tlsOptions().ClientCertificate, s.tlsOptions().ClientKey = args[0], args[1]
		case "lease":
			err = parseDuration(&s.Lease, args[0], "at least 1s, such as 30s")
			if err == nil {
				if err := checkLease(s.Lease); err != nil {
					return d.WrapErr(err)
				}
			}
		case "timeout":
			err = parseDuration(&s.Timeout, args[0], "a positive duration such as 250ms")
		case "on_error":
			if err := checkOnError(args[0]); err != nil {
				return d.WrapErr(err)
			}
			s.OnError = args[0]
		case "key_prefix":
			if err := checkKeyPrefix(args[0]); err != nil {
				return d.WrapErr(err)
			}
			s.KeyPrefix = args[0]
		}
		if err != nil {
			return d.Errf("inflight: store redis: %s %q is not allowed: want %v", opt, args[0], err)
		}
	}
	// At the block's closing brace: the settings that do not go together.
	if err := s.checkTopology(); err != nil {
		return d.WrapErr(err)
	}
	return nil
}

// warnLiteral warns, at the option's line, of a password written as it
// is: the adapted config holds it, and Caddy's `GET /config/` shows it.
func (s *Store) warnLiteral(d *caddyfile.Dispenser, opt, v string) {
	if strings.Contains(v, "{") { // a placeholder, replaced at load
		return
	}
	s.warnings = append(s.warnings, caddyconfig.Warning{File: d.File(), Line: d.Line(),
		Message: fmt.Sprintf("inflight: store redis: %s is written literally: Caddy's GET /config/ shows it to whoever reaches the admin API; write it as a placeholder such as {env.REDIS_PASSWORD} and set that variable", opt)})
}

// CaddyfileWarnings returns the warnings of the store's Caddyfile block,
// each at its file and line, for the directive to report.
func (s *Store) CaddyfileWarnings() []caddyconfig.Warning { return s.warnings }

// options are the store block's options, in the order the syntax lists
// them, with how many arguments each takes.
var options = []option{
	{"address", oneOrMore}, {"cluster", 0}, {"master_name", 1}, {"sentinel_username", 1}, {"sentinel_password", 1},
	{"username", 1}, {"password", 1}, {"db", 1}, {"tls", 0}, {"tls_ca", 1}, {"tls_server_name", 1}, {"tls_client_auth", 2},
	{"lease", 1}, {"on_error", 1}, {"timeout", 1}, {"key_prefix", 1},
}

// secretOptions are never shown in an error.
var secretOptions = map[string]bool{"password": true, "sentinel_password": true}

type option struct {
	name string
	args int // oneOrMore, or exactly this many
}

const oneOrMore = -1

var argsWanted = map[int]string{oneOrMore: "one or more addresses", 0: "no argument", 1: "one argument",
	2: "two arguments: the certificate and key files"}

// optionArgs returns how many arguments an option takes, and whether the
// option exists.
func optionArgs(name string) (int, bool) {
	i := slices.IndexFunc(options, func(o option) bool { return o.name == name })
	if i < 0 {
		return 0, false
	}
	return options[i].args, true
}

// tlsOptions returns the TLS settings, made if needed: any tls option
// turns TLS on.
func (s *Store) tlsOptions() *TLS {
	if s.TLS == nil {
		s.TLS = new(TLS)
	}
	return s.TLS
}

// parseDuration reads a positive duration; the error says what is allowed.
func parseDuration(dst *caddy.Duration, s, want string) error {
	d, err := caddy.ParseDuration(s)
	if err != nil || d <= 0 {
		return errors.New(want)
	}
	*dst = caddy.Duration(d)
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Store)(nil)
	_ caddy.Validator       = (*Store)(nil)
	_ caddy.CleanerUpper    = (*Store)(nil)
	_ caddyfile.Unmarshaler = (*Store)(nil)
)
