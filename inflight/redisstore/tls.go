package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/caddyserver/caddy/v2"
)

// TLS is how the store connects to Redis, and to the sentinels, over TLS.
// An empty object connects with the system's trusted roots and checks the
// certificate against the address's host.
type TLS struct {
	// CA is a PEM file of the certificate authorities that Redis's
	// certificate must chain to, instead of the system's roots.
	CA string `json:"ca,omitempty"`

	// ServerName is the name Redis's certificate must carry, when it is not
	// the address's host (an address given as an IP, say).
	ServerName string `json:"server_name,omitempty"`

	// ClientCertificate and ClientKey are PEM files of the certificate and
	// key this instance presents, for a Redis that requires one
	// (tls-auth-clients yes). Both or neither.
	ClientCertificate string `json:"client_certificate,omitempty"`
	ClientKey         string `json:"client_key,omitempty"`
}

// config returns the TLS configuration, and the files' contents, which a
// book's identity includes: a reload after a certificate was renewed on
// disk then connects with the new one.
func (t *TLS) config(repl *caddy.Replacer) (*tls.Config, []byte, error) {
	for _, f := range []struct {
		option string
		value  *string
	}{{"ca", &t.CA}, {"server_name", &t.ServerName}, {"client_certificate", &t.ClientCertificate}, {"client_key", &t.ClientKey}} {
		written := *f.value
		*f.value = repl.ReplaceAll(written, "")
		if written != "" && *f.value == "" {
			// An unset {env.X} would quietly mean the system's roots, or
			// no client certificate.
			return nil, nil, fmt.Errorf("inflight: store redis: tls %s %q is empty once its placeholders are replaced: want a value (is the variable set?)", f.option, written)
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	var material []byte
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err == nil {
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				err = errors.New("no PEM certificate in it")
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("inflight: store redis: tls ca %q is not allowed: %v: want a PEM file of CA certificates", t.CA, err)
		}
		material = append(material, pem...)
	}
	if (t.ClientCertificate == "") != (t.ClientKey == "") {
		return nil, nil, fmt.Errorf("inflight: store redis: tls client certificate %q and key %q: want both files or neither", t.ClientCertificate, t.ClientKey)
	}
	if t.ClientCertificate != "" {
		certPEM, err := os.ReadFile(t.ClientCertificate)
		var keyPEM []byte
		if err == nil {
			keyPEM, err = os.ReadFile(t.ClientKey)
		}
		var pair tls.Certificate
		if err == nil {
			pair, err = tls.X509KeyPair(certPEM, keyPEM)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("inflight: store redis: tls client certificate %q and key %q are not allowed: %v: want PEM files of a certificate and its private key", t.ClientCertificate, t.ClientKey, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		material = append(append(material, certPEM...), keyPEM...)
	}
	return cfg, material, nil
}

// checkedTLS is a TLS connection whose TCP socket go-redis's pool can
// peek at: a Redis that closed it (a restart) shows as EOF, and any bytes
// Redis sent unasked (with RESP2 there are none, see newBook) make go-redis
// drop it rather than read them.
type checkedTLS struct{ *tls.Conn }

func (c checkedTLS) SyscallConn() (syscall.RawConn, error) {
	return c.NetConn().(syscall.Conn).SyscallConn()
}
