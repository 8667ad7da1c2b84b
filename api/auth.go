package api

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// Tokens is the set of bearer tokens the API accepts (--auth-token-file).
// The file holds one token per line; blank lines and lines starting with '#'
// are ignored, surrounding white space is trimmed. Reload re-reads the file
// (on SIGHUP); a file that cannot be read or holds no token leaves the
// previous set in force. Safe for concurrent use.
type Tokens struct {
	path string
	set  atomic.Pointer[[][sha256.Size]byte]
}

// LoadTokens reads the token file at path. A file without any token is an
// error: an empty set would refuse every call, which is never what an
// operator meant.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Path is the token file's path.
func (t *Tokens) Path() string { return t.path }

// Len is the number of tokens in force.
func (t *Tokens) Len() int { return len(*t.set.Load()) }

// Reload re-reads the file; on error the tokens in force stay.
func (t *Tokens) Reload() error {
	data, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("auth token file: %w", err)
	}
	var set [][sha256.Size]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.ContainsAny(line, " \t") {
			return fmt.Errorf("auth token file %s line %d: a token must not contain white space", t.path, n)
		}
		set = append(set, sha256.Sum256([]byte(line)))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("auth token file %s: %w", t.path, err)
	}
	if len(set) == 0 {
		return fmt.Errorf("auth token file %s: no token (one per line, # comments)", t.path)
	}
	t.set.Store(&set)
	return nil
}

// errNoToken is the only thing a caller without a valid token learns.
var errNoToken = errors.New("missing or invalid bearer token")

// Check reports whether an Authorization header value carries a token in
// force ("Bearer <token>", the scheme case-insensitive). Tokens are compared
// as SHA-256 digests in constant time, every token of the set is compared
// (no early exit), so the time taken tells nothing about any token.
func (t *Tokens) Check(authorization string) bool {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return false
	}
	got := sha256.Sum256([]byte(token))
	match := 0
	for _, want := range *t.set.Load() {
		match |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	return match == 1
}
