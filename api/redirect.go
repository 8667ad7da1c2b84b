package api

import (
	"net"
	"net/http"
	"strings"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// Headers of a send this node could not place because the conversation's
// owner was out of its reach over the cluster link (sequencer.OwnerElsewhere):
// the owner's node id and client API address. Every protocol carries them
// (Connect and gRPC-Web as headers, gRPC as trailers too): a client that
// routes (the SDKs) can go there directly.
const (
	HeaderOwner     = "Sequencer-Owner"
	HeaderOwnerAddr = "Sequencer-Owner-Addr"
)

// redirectedParam marks a Send that a node already redirected: it is not
// redirected again (no loops between nodes that each see the other as cut).
const redirectedParam = "sequencer-redirected"

// unknownParam marks a redirect whose first attempt's outcome is unknown
// (the redirecting node's forward got no answer: 504): the owner may have
// stored it, so its answer must not say "not stored"
// (sequencer.WithEarlierOutcomeUnknown). Found by the availability run
// (db-and-peers-blackhole on n1): n2's forward to n1 was stored but its
// answer lost, n2 redirected the client to n1, and n1, cut from its store,
// answered the followed request "unavailable" at once.
const unknownParam = "sequencer-outcome-unknown"

// redirectToOwner answers a unary Connect Send, Edit or Recall (POST application/json or
// application/proto: plain HTTP clients, curl -L, fetch, requests, Go's
// net/http) that this node could not place because the owner was out of
// its reach, with HTTP 307 to the same call on the owner: a cut between
// the nodes is not one between the client and the owner, and an HTTP
// client follows a 307 with the same body, so the send is stored there
// (the same client_msg_id: exact whatever this node's attempt did). The
// body is still the Connect error (unavailable or deadline_exceeded), so a
// client that does not follow redirects reads the same error as before.
//
// Not redirected: gRPC and gRPC-Web (they do not follow HTTP redirects),
// browsers (a request with an Origin header: a cross-origin redirect of a
// CORS request is not followed), connect-go clients (v1.21.1 follows a 307
// but may replay an empty body: its unary payload is rewound while the first
// connection still holds it, "ContentLength=66 with Body length 0", a
// transport error where the 503 was an answer), a request that was
// redirected once, and
// a request with an Authorization header when the owner is on another host
// (HTTP clients drop the header on such a redirect, which would turn a
// retryable answer into unauthenticated).
func redirectToOwner(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has(unknownParam) {
			r = r.WithContext(sequencer.WithEarlierOutcomeUnknown(r.Context()))
		}
		if !redirectable(r) {
			next.ServeHTTP(w, r)
			return
		}
		// Routing may refuse a send over a slow link for a client that
		// follows redirects (sequencer.FollowsRedirects); not for one with
		// a bearer token, whose redirect may not happen (ownerURL): it is
		// forwarded, however slow the link.
		if r.Header.Get("Authorization") == "" {
			r = r.WithContext(sequencer.WithRedirects(r.Context()))
		}
		next.ServeHTTP(&redirectWriter{ResponseWriter: w, r: r}, r)
	})
}

func redirectable(r *http.Request) bool {
	switch r.URL.Path {
	case sequencerv1connect.SequencerServiceSendProcedure, sequencerv1connect.SequencerServiceEditProcedure,
		sequencerv1connect.SequencerServiceRecallProcedure:
	default:
		return false
	}
	if r.Method != http.MethodPost || r.Header.Get("Origin") != "" || r.URL.Query().Has(redirectedParam) ||
		strings.HasPrefix(r.Header.Get("User-Agent"), "connect-go/") {
		return false
	}
	ct := strings.ToLower(strings.TrimSpace(strings.SplitN(r.Header.Get("Content-Type"), ";", 2)[0]))
	return ct == "application/json" || ct == "application/proto"
}

// redirectWriter turns the error status of a send that names its owner
// into a 307 to it.
type redirectWriter struct {
	http.ResponseWriter
	r *http.Request
}

func (w *redirectWriter) WriteHeader(code int) {
	h := w.Header()
	if addr := h.Get(HeaderOwnerAddr); addr != "" && (code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout) {
		if loc, ok := ownerURL(w.r, addr); ok {
			if code == http.StatusGatewayTimeout {
				loc += "&" + unknownParam + "=1"
			}
			h.Set("Location", loc)
			code = http.StatusTemporaryRedirect
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *redirectWriter) Write(b []byte) (int, error) { return w.ResponseWriter.Write(b) }

func (w *redirectWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ownerURL is r's call on the node at addr (host:port), marked redirected;
// false when r's bearer token would not follow the redirect.
func ownerURL(r *http.Request, addr string) (string, bool) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", false
	}
	if r.Header.Get("Authorization") != "" {
		rh := r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			rh = h
		}
		if !strings.EqualFold(host, rh) {
			return "", false
		}
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + addr + r.URL.Path + "?" + redirectedParam + "=1", true
}
