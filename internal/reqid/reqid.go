// Package reqid gives every API request an id: taken from the X-Request-Id
// header when the caller sent a sane one, else generated; returned in the
// response's X-Request-Id header and carried in the request's context, where
// Handler adds it to log records as request_id.
package reqid

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/google/uuid"
)

// Header is the request and response header carrying the id.
const Header = "X-Request-Id"

// MaxLen is the longest id accepted from a caller.
const MaxLen = 128

type ctxKey struct{}

// With returns ctx carrying id.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// From returns the id ctx carries, or "".
func From(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// Sane reports whether a caller's id is kept: 1..MaxLen characters, each a
// letter, a digit or one of - _ . : / + = (what UUIDs, ULIDs, trace ids
// and base64 ids use; nothing that could break a log line).
func Sane(id string) bool {
	if len(id) == 0 || len(id) > MaxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' || c == '_' || c == '.' || c == ':' || c == '/' || c == '+' || c == '=':
		default:
			return false
		}
	}
	return true
}

// Middleware gives every request an id (the caller's X-Request-Id when
// Sane, else a random UUID), sets it on the response header before next
// runs, and puts it in the request's context.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(Header)
		if !Sane(id) {
			id = uuid.NewString()
		}
		w.Header().Set(Header, id)
		next.ServeHTTP(w, r.WithContext(With(r.Context(), id)))
	})
}

// Handler wraps h: a record logged with a context carrying an id (the
// ...Context methods of slog.Logger) gets the attribute request_id.
func Handler(h slog.Handler) slog.Handler { return handler{h} }

type handler struct{ slog.Handler }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	if id := From(ctx); id != "" {
		r = r.Clone()
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler { return handler{h.Handler.WithAttrs(as)} }
func (h handler) WithGroup(name string) slog.Handler    { return handler{h.Handler.WithGroup(name)} }
