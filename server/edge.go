package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"github.com/sequencer-im/sequencer/api"
	"github.com/sequencer-im/sequencer/internal/ratelog"
)

// edge holds the API's reloadable secrets: the TLS certificate, the client
// CAs and the bearer tokens. Reload re-reads both (SIGHUP); a file that fails keeps what
// is in force and the failure is returned (and logged by the caller).
type edge struct {
	cfg    Config
	cert   atomic.Pointer[tls.Certificate] // nil without TLS
	cas    atomic.Pointer[x509.CertPool]   // nil without --client-ca
	tokens *api.Tokens                     // nil without --auth-token-file
}

func newEdge(cfg Config) (*edge, error) {
	e := &edge{cfg: cfg}
	if cfg.TLSCert != "" {
		if err := e.loadCert(); err != nil {
			return nil, err
		}
	}
	if cfg.ClientCA != "" {
		if err := e.loadCAs(); err != nil {
			return nil, err
		}
	}
	if cfg.AuthTokenFile != "" {
		t, err := api.LoadTokens(cfg.AuthTokenFile)
		if err != nil {
			return nil, err
		}
		e.tokens = t
	}
	return e, nil
}

func (e *edge) loadCert() error {
	c, err := tls.LoadX509KeyPair(e.cfg.TLSCert, e.cfg.TLSKey)
	if err != nil {
		return fmt.Errorf("tls-cert/tls-key: %w", err)
	}
	e.cert.Store(&c)
	return nil
}

func (e *edge) loadCAs() error {
	pem, err := os.ReadFile(e.cfg.ClientCA)
	if err != nil {
		return fmt.Errorf("client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("client-ca %s: no PEM certificate in it", e.cfg.ClientCA)
	}
	e.cas.Store(pool)
	return nil
}

// tlsConfig is the API's TLS configuration, nil without --tls-cert. The
// certificate and the client CAs are looked up per handshake, so a reload
// applies to new connections at once.
func (e *edge) tlsConfig() (*tls.Config, error) {
	if e.cert.Load() == nil {
		return nil, nil
	}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return e.cert.Load(), nil
		},
	}
	if e.cas.Load() != nil {
		tc.ClientAuth = tls.RequireAndVerifyClientCert
		tc.ClientCAs = e.cas.Load()
		base := tc.Clone()
		tc.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := base.Clone()
			c.ClientCAs = e.cas.Load()
			return c, nil
		}
	}
	return tc, nil
}

// reload re-reads the certificate and the tokens.
func (e *edge) reload() error {
	var errs []error
	if e.cfg.TLSCert != "" {
		errs = append(errs, e.loadCert())
	}
	if e.cfg.ClientCA != "" {
		errs = append(errs, e.loadCAs())
	}
	if e.tokens != nil {
		errs = append(errs, e.tokens.Reload())
	}
	return errors.Join(errs...)
}

// httpErrorLog routes net/http's own error lines (refused TLS handshakes,
// malformed requests) to log at WARN, at most one line per 10 s with the
// count of the others: a port scanner must not flood the log.
func httpErrorLog(log *slog.Logger, what string) *stdlog.Logger {
	rl := ratelog.New(log, logEvery)
	return stdlog.New(writerFunc(func(p []byte) (int, error) {
		msg := strings.TrimSpace(string(p))
		if routineConnError(msg) {
			log.Debug(what+" connection closed by the client", "err", msg)
		} else {
			rl.Warn(what, what+" connection error", "err", msg)
		}
		return len(p), nil
	}), "", 0)
}

// routineConnError tells what a client's connection does in the normal
// course (goes away, closes mid-request, resets) from errors worth an
// operator's look (handshake failures, malformed requests).
func routineConnError(msg string) bool {
	for _, s := range []string{"GOAWAY", "EOF", "connection reset by peer", "broken pipe", "use of closed network connection",
		"client disconnected", "i/o timeout"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
