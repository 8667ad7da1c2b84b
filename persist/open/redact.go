package open

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// The password of a PostgreSQL DSN can sit in three places: the URL's
// userinfo ("postgres://u:PW@h/db"), a URL query parameter
// ("?password=PW") and a keyword DSN ("password=PW" or "password='P W'").
// Redact hides all three; Scrub hides the password wherever it shows up in
// a text (an error from the driver that echoes its input). A mysql:// URL
// keeps its password in the userinfo like a postgres:// URL; the
// go-sql-driver DSN form ("user:PW@tcp(host:port)/db"), which Parse refuses,
// is redacted too, as the refusal names it.

const hidden = "xxxxx"

// keywordStart is the start of a libpq keyword DSN: a key and '='.
var keywordStart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*\s*=`)

func isKeywordDSN(spec string) bool { return keywordStart.MatchString(spec) }

// driverDSN matches the go-sql-driver/mysql DSN form
// "[user[:password]@][net[(addr)]]/dbname[?params]" by its "@net(" part
// (or a bare "net(addr)/").
var driverDSN = regexp.MustCompile(`^([^/]*)@(tcp|tcp4|tcp6|unix|[a-z]+)\(|^(tcp|tcp4|tcp6|unix)\([^)]*\)/`)

func isDriverDSN(spec string) bool {
	return !strings.Contains(spec, "://") && driverDSN.MatchString(spec)
}

// driverUserinfoEnd is the index of the '@' before the network of a
// driver DSN (the last '@' before the first "(": a password may hold '@').
func driverUserinfoEnd(spec string) int {
	paren := strings.Index(spec, "(")
	if paren < 0 {
		return -1
	}
	return strings.LastIndex(spec[:paren], "@")
}

// kv is one key=value pair of a keyword DSN, with the value's byte range in
// the DSN (quotes included).
type kv struct {
	key, value string
	start, end int
}

// parseKeywordDSN splits a libpq keyword DSN: key = value pairs separated
// by white space; a value may be single-quoted, with \' and \\ escapes.
func parseKeywordDSN(dsn string) ([]kv, error) {
	var out []kv
	i := 0
	skip := func() {
		for i < len(dsn) && (dsn[i] == ' ' || dsn[i] == '\t' || dsn[i] == '\n' || dsn[i] == '\r') {
			i++
		}
	}
	for {
		skip()
		if i >= len(dsn) {
			return out, nil
		}
		ks := i
		for i < len(dsn) && dsn[i] != '=' && dsn[i] != ' ' && dsn[i] != '\t' {
			i++
		}
		key := dsn[ks:i]
		skip()
		if key == "" || i >= len(dsn) || dsn[i] != '=' {
			return nil, errors.New("want key=value pairs separated by spaces")
		}
		i++
		skip()
		vs := i
		var val strings.Builder
		if i < len(dsn) && dsn[i] == '\'' {
			i++
			closed := false
			for i < len(dsn) {
				c := dsn[i]
				if c == '\\' && i+1 < len(dsn) {
					val.WriteByte(dsn[i+1])
					i += 2
					continue
				}
				if c == '\'' {
					i++
					closed = true
					break
				}
				val.WriteByte(c)
				i++
			}
			if !closed {
				return nil, errors.New("unterminated quoted value")
			}
		} else {
			for i < len(dsn) && dsn[i] != ' ' && dsn[i] != '\t' && dsn[i] != '\n' && dsn[i] != '\r' {
				if dsn[i] == '\\' && i+1 < len(dsn) {
					i++
				}
				val.WriteByte(dsn[i])
				i++
			}
		}
		out = append(out, kv{key: key, value: val.String(), start: vs, end: i})
	}
}

// userinfoEnd returns the index of the '@' ending a URL DSN's userinfo in
// rest (the DSN after "://"), or -1: the last '@' before the query. A
// password with an unescaped '/' or '@' (invalid, but it happens) is still
// taken as part of the userinfo, so it is hidden too.
func userinfoEnd(rest string) int {
	if j := strings.IndexAny(rest, "?#"); j >= 0 {
		rest = rest[:j]
	}
	return strings.LastIndex(rest, "@")
}

// urlQueryPassword matches a password query parameter of a URL DSN.
var urlQueryPassword = regexp.MustCompile(`(?i)([?&]password=)[^&#]*`)

// Redact returns a --store value fit for logs and messages: a URL DSN's
// password (userinfo or query) and a keyword DSN's password= value become
// "xxxxx". Paths come back unchanged. A keyword DSN that does not parse
// comes back as "(unparsable keyword DSN)".
func Redact(spec string) string {
	spec = strings.TrimSpace(spec)
	if scheme, rest, ok := strings.Cut(spec, "://"); ok {
		if at := userinfoEnd(rest); at >= 0 {
			if u, _, hasPW := strings.Cut(rest[:at], ":"); hasPW {
				rest = u + ":" + hidden + rest[at:]
			}
		}
		return urlQueryPassword.ReplaceAllString(scheme+"://"+rest, "${1}"+hidden)
	}
	if isDriverDSN(spec) {
		if at := driverUserinfoEnd(spec); at >= 0 {
			if u, _, hasPW := strings.Cut(spec[:at], ":"); hasPW {
				return u + ":" + hidden + spec[at:]
			}
		}
		return spec
	}
	if isKeywordDSN(spec) {
		pairs, err := parseKeywordDSN(spec)
		if err != nil {
			return "(unparsable keyword DSN)"
		}
		out := spec
		for k := len(pairs) - 1; k >= 0; k-- { // from the end: offsets stay valid
			if strings.EqualFold(pairs[k].key, "password") {
				out = out[:pairs[k].start] + hidden + out[pairs[k].end:]
			}
		}
		return out
	}
	return spec
}

// passwords returns every spelling of the DSN's password that a driver
// could echo: as written, percent-decoded, unquoted.
func passwords(dsn string) []string {
	var pws []string
	add := func(p string) {
		if p != "" && p != hidden {
			pws = append(pws, p)
		}
	}
	if _, rest, ok := strings.Cut(dsn, "://"); ok {
		if at := userinfoEnd(rest); at >= 0 {
			if _, pw, has := strings.Cut(rest[:at], ":"); has {
				add(pw)
				if d, err := url.PathUnescape(pw); err == nil {
					add(d)
				}
			}
		}
		for _, m := range urlQueryPassword.FindAllString(dsn, -1) {
			_, pw, _ := strings.Cut(m, "=")
			add(pw)
			if d, err := url.QueryUnescape(pw); err == nil {
				add(d)
			}
		}
		return pws
	}
	if isDriverDSN(dsn) {
		if at := driverUserinfoEnd(dsn); at >= 0 {
			if _, pw, has := strings.Cut(dsn[:at], ":"); has {
				add(pw)
			}
		}
		return pws
	}
	if pairs, err := parseKeywordDSN(dsn); err == nil {
		for _, p := range pairs {
			if strings.EqualFold(p.key, "password") {
				add(p.value)
				add(strings.TrimSpace(dsn[p.start:p.end]))
			}
		}
	}
	return pws
}

// Scrub replaces every spelling of spec's password in text with "xxxxx".
func Scrub(spec, text string) string {
	for _, pw := range passwords(strings.TrimSpace(spec)) {
		text = strings.ReplaceAll(text, pw, hidden)
	}
	return text
}

// scrubbed is an error whose text has the DSN's password removed; the cause
// stays in the chain for errors.Is/As.
type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// ScrubError returns err with spec's password removed from its text (nil
// stays nil).
func ScrubError(spec string, err error) error {
	if err == nil {
		return nil
	}
	msg := Scrub(spec, err.Error())
	if msg == err.Error() {
		return err
	}
	return &scrubbed{msg: msg, err: err}
}
